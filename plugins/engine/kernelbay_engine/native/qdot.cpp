// kernelbay-engine's quantized linear for few rows: int8 activations (one scale per block of 32, as llama.cpp's Q8_1)
// times 4- or 8-bit weights (one fp16 scale and offset per block of 32), summed exactly in int32 by AVX-512 VNNI
// (vpdpbusd: 64 unsigned-by-signed byte products a call). What the quantized model's decode step spends most of its
// time in: at one row the weights are streamed once and the arithmetic hides behind the memory reads.
//
// A weight block b of row n stands for w = d[n, b] * u + m[n, b], u the unsigned codes (0..15, or the int8 codes
// + 128); an activation block for x ~ s * q with q int8 = round(x / s), s = max|x| / 127. So
//   y[r, n] = sum_b s[r, b] * (d[n, b] * sum(u * q) + m[n, b] * sum(q)),
// the dot of the weights the codes stand for with the activations rounded to int8: the only approximation.
//
// Packed layout (kernelbay_engine.quant.kernels.NativeDotKernel builds it): blocks in pairs (a row's block count
// padded to even with a zero block); 4-bit: 32 bytes a pair, byte i = u[2j, i] | u[2j + 1, i] << 4; 8-bit: 64 bytes
// a pair, block 2j then 2j + 1. d and m fp16 [N, K / 32] (K exactly: the padding block has none).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace kernelbay {
namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kChunk = 16;  // blocks whose scales one zmm holds
constexpr int64_t kTile = 4;    // activation rows sharing one read of the weights
constexpr int64_t kQuadOrder[4] = {0, 2, 1, 3};

constexpr int64_t kAhead = 2048;  // bytes of codes prefetched ahead: best of 512-4096 on a 2-core EPYC (1.9x over none)
#define KB_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

// The activations quantized: q [rows, blocks_padded * 32] int8, s and s * sum(q) [rows, blocks_padded], zero past
// the real blocks (so chunks of 16 blocks load whole). With `quads`, the first 4 * quads blocks of q are stored in
// the order 0, 2, 1, 3 within each group of four: the order one 64-byte load of two 4-bit pairs unpacks to (the low
// nibbles hold blocks 0 and 2, the high ones 1 and 3).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale, scaled_sum;
  int64_t stride_blocks;
};

KB_TARGET void quantize_rows(const float* x, int64_t rows, int64_t k, int64_t quads, QuantizedRows& out) {
  const int64_t blocks = k / kBlock;
  const int64_t padded = (blocks + kChunk - 1) / kChunk * kChunk;
  out.stride_blocks = padded;
  out.q.assign(rows * padded * kBlock, 0);
  out.scale.assign(rows * padded, 0.0f);
  out.scaled_sum.assign(rows * padded, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* src = x + r * k + b * kBlock;
      const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const bool nan = _mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q);
      // a NaN or inf activation makes its block's scale NaN, so it reaches the output as aten's product would
      const float s = nan || amax == INFINITY ? NAN : amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
      // round to nearest even (the default MXCSR mode), saturated to int8 (|x / s| <= 127 up to rounding)
      const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
      const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
      const int64_t at = b < 4 * quads ? (b & ~int64_t{3}) | kQuadOrder[b & 3] : b;
      int8_t* dst = out.q.data() + (r * padded + at) * kBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(qhi));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
      out.scale[r * padded + b] = s;
      out.scaled_sum[r * padded + b] = s * static_cast<float>(sum);
    }
  }
}

template <int Bits>
KB_TARGET inline __m512i load_pair(const uint8_t* codes) {
  if constexpr (Bits == 8) {
    return _mm512_loadu_si512(codes);
  } else {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i first = _mm256_and_si256(packed, mask);
    const __m256i second = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
    return _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
  }
}

// Output rows [n0, n1) of `tile` activation rows: per weight row, per chunk of 16 blocks, the pairs' int32 dots
// scaled by d * s (lanes 0-7 the pair's first block, 8-15 its second) and the offsets' m * s * sum(q).
template <int Bits, int Tile>
KB_TARGET void dot_rows(const uint8_t* codes, const uint16_t* d, const uint16_t* m, int64_t blocks, int64_t real,
                        const QuantizedRows& xq, int64_t r0, int64_t n0, int64_t n1, int64_t out_stride, float* y) {
  constexpr int64_t pair_bytes = Bits == 8 ? 2 * kBlock : kBlock;
  const int64_t row_bytes = blocks / 2 * pair_bytes;
  const __m512i first_lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i quad_lanes = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i one = _mm512_set1_epi32(1);
  const int64_t xs = xq.stride_blocks;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = codes + n * row_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(d + (n + 8) * real), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(m + (n + 8) * real), _MM_HINT_T0);
    __m512 acc[2][Tile], offs[Tile];  // two accumulators a row: consecutive pairs' FMAs do not wait on each other
    for (int t = 0; t < Tile; ++t) acc[0][t] = acc[1][t] = offs[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < blocks; c += kChunk) {
      const int64_t nb = blocks - c < kChunk ? blocks - c : kChunk;
      const int64_t scaled = real - c < nb ? real - c : nb;  // the padding block has no scale: lane 0
      const __mmask16 mask = static_cast<__mmask16>((1u << scaled) - 1u);
      const __m512 dv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, d + n * real + c));
      const __m512 mv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, m + n * real + c));
      __m512 ds[Tile];
      for (int t = 0; t < Tile; ++t) {
        const int64_t base = (r0 + t) * xs + c;
        ds[t] = _mm512_mul_ps(dv, _mm512_loadu_ps(xq.scale.data() + base));
        offs[t] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(xq.scaled_sum.data() + base), offs[t]);
      }
      int64_t j = 0;
      if constexpr (Bits == 4) {  // two pairs a load: half the unpacking, no insert
        const __m512i nibbles = _mm512_set1_epi8(0x0F);
        for (; j + 4 <= nb; j += 4) {
          const uint8_t* quad = wrow + (c + j) / 2 * pair_bytes;
          _mm_prefetch(reinterpret_cast<const char*>(quad) + kAhead, _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(quad);
          const __m512i w02 = _mm512_and_si512(v, nibbles);
          const __m512i w13 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibbles);
          const __m512i at = _mm512_set1_epi32(static_cast<int>(j));
          const __m512i lanes02 = _mm512_add_epi32(quad_lanes, at);
          const __m512i lanes13 = _mm512_add_epi32(_mm512_add_epi32(quad_lanes, one), at);
          for (int t = 0; t < Tile; ++t) {
            const int8_t* a = xq.q.data() + ((r0 + t) * xs + c + j) * kBlock;
            const __m512i d02 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w02, _mm512_loadu_si512(a));
            const __m512i d13 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w13, _mm512_loadu_si512(a + 64));
            acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d02), _mm512_permutexvar_ps(lanes02, ds[t]), acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d13), _mm512_permutexvar_ps(lanes13, ds[t]), acc[1][t]);
          }
        }
      }
      for (; j < nb; j += 2) {
        const uint8_t* pair = wrow + (c + j) / 2 * pair_bytes;
        _mm_prefetch(reinterpret_cast<const char*>(pair) + kAhead, _MM_HINT_T0);
        const __m512i w = load_pair<Bits>(pair);
        const __m512i lanes = _mm512_add_epi32(first_lanes, _mm512_set1_epi32(static_cast<int>(j)));
        for (int t = 0; t < Tile; ++t) {
          const __m512i a = _mm512_loadu_si512(xq.q.data() + ((r0 + t) * xs + c + j) * kBlock);
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
          __m512& sum = acc[(j >> 1) & 1][t];
          sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, ds[t]), sum);
        }
      }
    }
    for (int t = 0; t < Tile; ++t)
      y[(r0 + t) * out_stride + n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]), offs[t]));
  }
}

template <int Bits>
void dot_all(const uint8_t* codes, const uint16_t* d, const uint16_t* m, int64_t blocks, int64_t real,
             const QuantizedRows& xq, int64_t rows, int64_t n, float* y) {
  // ~16 output rows a task at least: a call's parallel region costs a few us, a row of a small layer ~0.1 us
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    int64_t r = 0;
    for (; r + kTile <= rows; r += kTile) dot_rows<Bits, kTile>(codes, d, m, blocks, real, xq, r, n0, n1, n, y);
    for (; r + 2 <= rows; r += 2) dot_rows<Bits, 2>(codes, d, m, blocks, real, xq, r, n0, n1, n, y);
    for (; r < rows; ++r) dot_rows<Bits, 1>(codes, d, m, blocks, real, xq, r, n0, n1, n, y);
  });
}

}  // namespace

bool qdot_supported() {
  static const bool supported = [] {  // asked once: qdot checks it on every call
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
  }();
  return supported;
}

// y [M, N] float32 = x [M, K] float32 times the packed weight (see the layout above).
at::Tensor qdot(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& m, int64_t bits) {
  TORCH_CHECK(qdot_supported(), "qdot: this CPU lacks AVX-512 VNNI");
  TORCH_CHECK(bits == 4 || bits == 8, "qdot: bits must be 4 or 8, got ", bits);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "qdot: x must be contiguous float32 [M, K]");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 2 && codes.is_contiguous(), "qdot: codes must be uint8 [N, bytes]");
  TORCH_CHECK(d.scalar_type() == at::kHalf && m.scalar_type() == at::kHalf && d.dim() == 2 && d.is_contiguous() &&
                  m.is_contiguous() && m.sizes() == d.sizes() && d.size(0) == codes.size(0),
              "qdot: d and m must be contiguous float16 [N, K / 32]");
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0), real = d.size(1), blocks = real + real % 2;
  TORCH_CHECK(k % kBlock == 0, "qdot: K = ", k, " is not a multiple of ", kBlock);
  TORCH_CHECK(k == real * kBlock, "qdot: x has K = ", k, ", the weight ", real * kBlock);
  TORCH_CHECK(codes.size(1) == blocks * kBlock * bits / 8, "qdot: codes hold ", codes.size(1), " bytes a row, ",
              blocks * kBlock * bits / 8, " expected");
  at::Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  QuantizedRows xq;
  // padded blocks of x are zero: q = 0, s = 0, so the weights' zero padding blocks add nothing
  quantize_rows(x.data_ptr<float>(), rows, k, bits == 4 ? blocks / 4 : 0, xq);
  const auto* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  const auto* mp = reinterpret_cast<const uint16_t*>(m.data_ptr<at::Half>());
  if (bits == 4) {
    dot_all<4>(codes.data_ptr<uint8_t>(), dp, mp, blocks, real, xq, rows, n, y.data_ptr<float>());
  } else {
    dot_all<8>(codes.data_ptr<uint8_t>(), dp, mp, blocks, real, xq, rows, n, y.data_ptr<float>());
  }
  return y;
}

}  // namespace kernelbay
