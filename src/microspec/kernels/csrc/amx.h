// What the AMX paths of cpu_quant (linear_x8.cpp, int8 tiles) and cpu_linear (linear_bf16.cpp, bf16 tiles) share:
// whether the CPU and Linux let this process use the tiles, and loading a tile configuration.
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace {

// Whether the CPU reports AMX tiles and the tile product of CPUID.(7, 0):EDX bit `product` (25 int8, 22 bf16), and
// Linux lets this process use them (the tile data is state the kernel saves only for a process that asked:
// arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked once per process)
inline bool amx_permitted(int product) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1u) || !((d >> product) & 1u)) return false;  // AMX-TILE and the product
  static const bool granted = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}

// Whether this CPU has AMX tiles with bf16 products (and AVX-512 BF16 for the conversions) that this process may
// use, asked once
inline bool amx_bf16_usable() {
  static const bool usable = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && amx_permitted(22);
  }();
  return usable;
}

// A tile configuration, palette 1: each tile's bytes a row and rows
struct alignas(64) TileConfig {
  uint8_t palette = 1, start = 0, pad[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) inline void load_tile_config(const TileConfig& c) {
  // GCC does not see ldtilecfg read its operand and drops the stores that filled it without this barrier
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

}  // namespace
