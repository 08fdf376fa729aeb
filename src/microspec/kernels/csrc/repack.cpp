// The interleaved forms (see blocks.h): repack_x8 lays 8 rows' blocks side by side (Q4_K's sub-block scales
// unpacked to a byte each), x8_gather takes rows back to the file's block format (the same bytes as the file's rows).
#include "blocks.h"
#include "quant.h"

namespace {

// Row s's file block <-> its place in a K-quant tile-block tb (kq 12: Q4_K, 14: Q6_K)
inline int q6_get(const uint8_t* b, int e) {  // quant e (0..255) of a Q6_K file block, 0..63
  const int h = e / 128, r = e % 128, s = r / 64, p = r % 64;
  return ((b[h * 64 + p] >> (4 * s)) & 15) | (((b[128 + h * 32 + p % 32] >> (2 * (2 * s + p / 32))) & 3) << 4);
}
inline void q6_set(uint8_t* b, int e, int q) {  // into a zeroed Q6_K file block
  const int h = e / 128, r = e % 128, s = r / 64, p = r % 64;
  b[h * 64 + p] |= uint8_t((q & 15) << (4 * s));
  b[128 + h * 32 + p % 32] |= uint8_t((q >> 4) << (2 * (2 * s + p / 32)));
}

void k8_put(int kq, const uint8_t* fb, int s, uint8_t* tb) {  // into a zeroed tile-block
  if (kq == 12) {
    std::memcpy(tb + 2 * s, fb, 2);
    std::memcpy(tb + 16 + 2 * s, fb + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(fb + 4, j, sc, m);
      tb[32 + 16 * j + 2 * s] = uint8_t(sc);
      tb[32 + 16 * j + 2 * s + 1] = uint8_t(m);
      uint8_t* q = tb + 160 + 128 * j;
      for (int k = 0; k < 32; ++k) {
        const int v = (fb[16 + 32 * (j >> 1) + k] >> (4 * (j & 1))) & 15;
        q[x8_byte(s, k)] |= uint8_t(k < 16 ? v : v << 4);
      }
    }
    return;
  }
  std::memcpy(tb + 2 * s, fb + 208, 2);
  for (int j = 0; j < 8; ++j) {
    tb[16 + 16 * j + 2 * s] = fb[192 + 2 * j];
    tb[16 + 16 * j + 2 * s + 1] = fb[192 + 2 * j + 1];
    uint8_t* q = tb + 144 + 192 * j;
    for (int k = 0; k < 32; ++k) {
      const int v = q6_get(fb, 32 * j + k);
      q[x8_byte(s, k)] |= uint8_t(k < 16 ? (v & 15) : (v & 15) << 4);
      q[k8_hi_byte(s, k)] |= uint8_t((v >> 4) << k8_hi_shift(k));
    }
  }
}

void k8_get(int kq, const uint8_t* tb, int s, uint8_t* fb) {  // into a zeroed file block
  if (kq == 12) {
    std::memcpy(fb, tb + 2 * s, 2);
    std::memcpy(fb + 2, tb + 16 + 2 * s, 2);
    uint8_t* p = fb + 4;  // the inverse of scale_min_k4: every one of the 96 bits is used, so the bytes are the file's
    for (int j = 0; j < 8; ++j) {
      const int sc = tb[32 + 16 * j + 2 * s], m = tb[32 + 16 * j + 2 * s + 1];
      if (j < 4) { p[j] |= uint8_t(sc); p[j + 4] |= uint8_t(m); }
      else {
        p[j + 4] = uint8_t((sc & 15) | ((m & 15) << 4));
        p[j - 4] |= uint8_t((sc >> 4) << 6);
        p[j] |= uint8_t((m >> 4) << 6);
      }
      const uint8_t* q = tb + 160 + 128 * j;
      for (int k = 0; k < 32; ++k) {
        const uint8_t nb = q[x8_byte(s, k)];
        fb[16 + 32 * (j >> 1) + k] |= uint8_t(((k < 16 ? nb : nb >> 4) & 15) << (4 * (j & 1)));
      }
    }
    return;
  }
  std::memcpy(fb + 208, tb + 2 * s, 2);
  for (int j = 0; j < 8; ++j) {
    fb[192 + 2 * j] = tb[16 + 16 * j + 2 * s];
    fb[192 + 2 * j + 1] = tb[16 + 16 * j + 2 * s + 1];
    const uint8_t* q = tb + 144 + 192 * j;
    for (int k = 0; k < 32; ++k) {
      const uint8_t nb = q[x8_byte(s, k)];
      const int lo = (k < 16 ? nb : nb >> 4) & 15, hi = (q[k8_hi_byte(s, k)] >> k8_hi_shift(k)) & 3;
      q6_set(fb, 32 * j + k, lo | (hi << 4));
    }
  }
}

}  // namespace

// Rows `ids` of an interleaved form w (type) back in the file's block format [n, row bytes] (a static shortlist's
// or a draft head's rows: the same bytes as the file's rows)
torch::Tensor x8_gather(torch::Tensor w, int64_t type, int64_t K, torch::Tensor ids) {
  const X8Info xi = x8_info(type);
  TORCH_CHECK(xi.ok, "x8_gather: not an interleaved form");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1 && w.size(1) == K / 32 * xi.gbytes,
              "w: uint8 [N / 8, tile bytes]");
  TORCH_CHECK(ids.dtype() == torch::kLong && ids.dim() == 1, "ids: int64 [n]");
  TORCH_CHECK(K % (xi.kq ? 256 : 32) == 0, "x8_gather: K is not a whole number of blocks");
  ids = ids.contiguous();
  const QType q = qtype(type - 1000);
  const int64_t n = ids.size(0), N = w.size(0) * 8, RB = w.stride(0), G = K / 32;
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(ip[i] >= 0 && ip[i] < N, "row id ", ip[i], " out of range");
  const int64_t row_bytes = K / q.block * q.bytes;
  auto out = torch::zeros({n, row_bytes}, w.options().memory_format(at::MemoryFormat::Contiguous));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const int lead = xi.min ? 4 : 2;
  at::parallel_for(0, n, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = ip[i] / 8;
      const int s = int(ip[i] % 8);
      if (xi.kq) {  // out is zeroed
        for (int64_t b = 0; b < K / 256; ++b)
          k8_get(xi.kq, wp + t * RB + b * 8 * xi.gbytes, s, op + i * row_bytes + b * q.bytes);
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* b = wp + t * RB + g * xi.gbytes;
        uint8_t* o = op + i * row_bytes + g * q.bytes;
        std::memcpy(o, b + 2 * s, 2);
        if (xi.q8) {
          for (int k = 0; k < 32; ++k) o[2 + k] = b[xi.head + x8_chunk_byte(s, k)];
          continue;
        }
        if (xi.min) std::memcpy(o + 2, b + 16 + 2 * s, 2);
        uint32_t qh = 0;
        uint8_t* qs = o + lead + (xi.q5 ? 4 : 0);
        for (int k = 0; k < 32; ++k) {
          const uint8_t nb = b[xi.head + x8_byte(s, k)];
          if (k < 16) qs[k] = nb & 15; else qs[k - 16] |= uint8_t(nb & 0xF0);
          if (xi.q5) qh |= uint32_t((b[xi.head + x8_bit_byte(s, k)] >> (k >> 2)) & 1) << k;
        }
        if (xi.q5) std::memcpy(o + lead, &qh, 4);
      }
    }
  });
  return out;
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 rows w [N, row bytes] (N a multiple of 8) -> their interleaved form (type + 1000, see X8):
// [N / 8, 8 x row bytes], the same scales, mins and quant bits.
torch::Tensor repack_x8(torch::Tensor w, int64_t type) {
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.stride(1) == 1, "w: uint8 [N, row bytes]");
  TORCH_CHECK(type == 2 || type == 3 || type == 6 || type == 7 || type == 8 || type == 12 || type == 14,
              "repack_x8: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K or Q6_K only");
  const QType q = qtype(type);
  const X8Info xi = x8_info(type + 1000);
  TORCH_CHECK(w.size(1) % q.bytes == 0, "w's row bytes are not whole blocks");
  TORCH_CHECK(w.size(0) % 8 == 0, "repack_x8: the number of rows must be a multiple of 8");
  const int64_t N = w.size(0), RB = w.stride(0), G = w.size(1) / q.bytes * (q.block / 32);  // 32-element groups
  const int lead = xi.min ? 4 : 2;  // scale (+ min) bytes of a packed block
  auto out = torch::zeros({N / 8, G * xi.gbytes}, w.options().memory_format(at::MemoryFormat::Contiguous));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 8, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (xi.kq) {
        for (int64_t b = 0; b < G / 8; ++b)
          for (int s = 0; s < 8; ++s)
            k8_put(xi.kq, wp + (8 * t + s) * RB + b * q.bytes, s, op + t * G * xi.gbytes + b * 8 * xi.gbytes);
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        uint8_t* o = op + t * G * xi.gbytes + g * xi.gbytes;
        for (int s = 0; s < 8; ++s) {
          const uint8_t* b = wp + (8 * t + s) * RB + g * q.bytes;
          std::memcpy(o + 2 * s, b, 2);
          if (xi.q8) {
            for (int k = 0; k < 32; ++k) o[xi.head + x8_chunk_byte(s, k)] = b[2 + k];
            continue;
          }
          if (xi.min) std::memcpy(o + 16 + 2 * s, b + 2, 2);
          uint32_t qh = 0;
          if (xi.q5) std::memcpy(&qh, b + lead, 4);
          const uint8_t* qs = b + lead + (xi.q5 ? 4 : 0);
          for (int k = 0; k < 32; ++k) {
            const int nib = k < 16 ? (qs[k] & 15) : (qs[k - 16] >> 4);
            o[xi.head + x8_byte(s, k)] |= uint8_t(k < 16 ? nib : nib << 4);
            if (xi.q5) o[xi.head + x8_bit_byte(s, k)] |= uint8_t(((qh >> k) & 1) << (k >> 2));
          }
        }
      }
    }
  });
  return out;
}
