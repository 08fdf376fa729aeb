// The kernels' tuned choices for one call: microspec.kernels.plan.KernelPlan packs them into one int64 that every
// product, attention and layer entry point takes (a model's runtime chooses them once, at load), so no choice is
// process state.  Each changes the speed only, never a value; one the CPU lacks falls back where it is used (a path
// to AVX2, the 512-bit attention and the bf16 tiles to their other forms).
#pragma once

#include <algorithm>
#include <cstdint>

namespace microspec {

struct Plan {
  int path = 0;                // the integer products: 0 AVX2, 1 VNNI on 256-bit registers, 2 on 512-bit, 3 AMX
  int64_t prefetch_tiles = 4;  // how far ahead a product taken one tile at a time prefetches its tiles (0: none)
  int64_t amx_min_rows = 1;    // from how many rows path 3 multiplies on AMX tiles
  bool amx_every = false;      // path 3 takes every type and row count from amx_min_rows on to the tiles
  bool att_wide = false;       // the attention's 512-bit form
  bool amx_bf16 = false;       // bf16 products on AMX tiles

  // bits 0-3 path, 4-11 prefetch tiles (at most 64), 12 amx_every, 13 att_wide, 14 amx_bf16, 16-39 amx_min_rows
  static Plan of(int64_t code) {
    Plan p;
    p.path = int(code & 0xF);
    p.prefetch_tiles = std::min<int64_t>((code >> 4) & 0xFF, 64);
    p.amx_every = (code >> 12) & 1;
    p.att_wide = (code >> 13) & 1;
    p.amx_bf16 = (code >> 14) & 1;
    p.amx_min_rows = std::max<int64_t>(1, (code >> 16) & 0xFFFFFF);
    return p;
  }
};

}  // namespace microspec
