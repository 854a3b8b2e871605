// kernelbay-engine's native CPU ops: one call where aten's composites dispatch several small kernels, with the
// same float arithmetic (tested bit for bit against aten) except rms_norm's mean, summed in an order of its own
// (mean_square). Compiled on first use by kernelbay_engine.native.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#define KB_AVX512_TARGET __attribute__((target("avx512f,avx512dq")))

// libtorch_cpu's SLEEF exp: what aten's Vectorized<float>::exp() calls on an AVX-512 CPU (its silu kernel's exp).
// Declared with the AVX-512 target so that its vector argument and result travel in zmm registers, as it expects.
extern "C" KB_AVX512_TARGET __m512 Sleef_expf16_u10(__m512);

namespace kernelbay {
bool qdot_supported();  // qdot.cpp
at::Tensor qdot(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& m, int64_t bits);
bool fdot_supported();  // fdot.cpp
at::Tensor fdot_pack(const at::Tensor& w);
at::Tensor fdot(const at::Tensor& x, const at::Tensor& panels, int64_t n);
}  // namespace kernelbay

namespace {

// The mean of x * x over a float32 row in a fixed order: 64 running sums (element j into sum j % 64, each product
// rounded first: built with -ffp-contract=off), folded pairwise (32 + 32, 16 + 16, ...), divided by the row's length.
// aten's at::mean sums in its cascade order instead: the result is within float32 rounding of it, not its bits.
// Calling at::mean (a product, a sum, a division and their allocations: ~6 dispatches, each cache-cold between two
// weight streams) cost ~3 ms of SmolLM2's ~27 ms float32 decode step and ~1 ms of its Q4_1 one; this loop ~0.01 ms.
// A row's result depends on its values alone (never on the rows beside it or the thread count), so a token gets the
// same bits alone, in a batch or inside a speculative verify row.
float mean_square(const float* row, int64_t dim) {
  constexpr int64_t kSums = 64;
  float sums[kSums] = {};
  int64_t j = 0;
  for (; j + kSums <= dim; j += kSums)
    for (int64_t l = 0; l < kSums; ++l) sums[l] += row[j + l] * row[j + l];
  for (int64_t l = 0; j + l < dim; ++l) sums[l] += row[j + l] * row[j + l];
  for (int64_t half = kSums / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) sums[l] += sums[l + half];
  return sums[0] / static_cast<float>(dim);
}

// RMSNorm of float32 rows: x * (1 / sqrt(mean_square(x) + eps)) * w per element, as aten's composite computes it
// from its mean; `bf16` rounds that result to bfloat16 (nearest even, as `.to(bfloat16)`) for a consumer computing in
// it. One call instead of ~8 internal dispatches (and the cast).
template <typename Out>
void normalize(const float* in, const float* w, float eps, int64_t rows, int64_t dim, Out* o) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * dim;
    const float inv = 1.0f / std::sqrt(mean_square(row, dim) + eps);
    Out* dst = o + r * dim;
    for (int64_t j = 0; j < dim; ++j) dst[j] = static_cast<Out>((row[j] * inv) * w[j]);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool bf16) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: float32 only");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rms_norm: contiguous tensors only");
  const int64_t dim = x.size(-1);
  TORCH_CHECK(weight.numel() == dim, "rms_norm: weight has ", weight.numel(), " elements, rows have ", dim);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  at::Tensor out = at::empty_like(x, bf16 ? x.options().dtype(at::kBFloat16) : x.options());
  const float* in = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float e = static_cast<float>(eps);
  if (bf16) {
    normalize(in, w, e, rows, dim, out.data_ptr<at::BFloat16>());
  } else {
    normalize(in, w, e, rows, dim, out.data_ptr<float>());
  }
  return out;
}

// One head's rotation, the arithmetic both RoPE ops share: dst = x * cos + rotate_half(x) * sin with
// rotate_half(x) = (-x[D/2:], x[:D/2]), x widened to float exactly (bfloat16 input), each product rounded and then
// summed (built with -ffp-contract=off: no fused multiply-add), as transformers' `apply_rotary_pos_emb`.
template <typename In>
inline void rotate_head(const In* x, const float* c, const float* s, int64_t dim, float* dst) {
  const int64_t half = dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float a = static_cast<float>(x[j]) * c[j];
    const float b = -static_cast<float>(x[j + half]) * s[j];
    dst[j] = a + b;
  }
  for (int64_t j = half; j < dim; ++j) {
    const float a = static_cast<float>(x[j]) * c[j];
    const float b = static_cast<float>(x[j - half]) * s[j];
    dst[j] = a + b;
  }
}

// RoPE with every dim rotating (no interleave) of float32 x [T, N, D] (last dim contiguous) by cos, sin [T, D]:
// each head as rotate_head computes it.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rope: float32 only");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "rope: x must be [T, N, D] with its last dim contiguous");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  TORCH_CHECK(dim % 2 == 0, "rope: the head size must be even, got ", dim);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && sin.sizes() == cos.sizes() &&
                  cos.size(0) == tokens && cos.size(1) == dim,
              "rope: cos and sin must be contiguous [T, D] = [", tokens, ", ", dim, "]");
  at::Tensor out = at::empty({tokens, heads, dim}, x.options());
  const float* in = x.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t st = x.stride(0), sh = x.stride(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* ct = c + t * dim;
    const float* stt = s + t * dim;
    for (int64_t h = 0; h < heads; ++h) rotate_head(in + t * st + h * sh, ct, stt, dim, o + (t * heads + h) * dim);
  }
  return out;
}

// q, k, v of a fused projection's output qkv [T, (H + 2 Hk) * D] (float32, or the bfloat16 a quantized kernel gives:
// widened exactly), as three contiguous float32 [T, *, D], q and k rotated by rotate_head: the cast, the split by
// heads and the rotation in one call.
template <typename In>
void split_rotate(const In* in, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, const float* c,
                  const float* s, float* q, float* k, float* v) {
  const int64_t width = (heads + 2 * kv_heads) * dim;
  for (int64_t t = 0; t < tokens; ++t) {
    const In* row = in + t * width;
    const float* ct = c + t * dim;
    const float* stt = s + t * dim;
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      float* dst = h < heads ? q + (t * heads + h) * dim : k + (t * kv_heads + h - heads) * dim;
      rotate_head(row + h * dim, ct, stt, dim, dst);
    }
    const In* x = row + (heads + kv_heads) * dim;
    float* dst = v + t * kv_heads * dim;
    for (int64_t j = 0; j < kv_heads * dim; ++j) dst[j] = static_cast<float>(x[j]);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope(const at::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                                        const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16,
              "qkv_rope: qkv must be float32 or bfloat16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "qkv_rope: float32 tables only");
  TORCH_CHECK(cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() && sin.sizes() == cos.sizes(),
              "qkv_rope: cos and sin must be contiguous [T, D]");
  const int64_t tokens = cos.size(0), dim = cos.size(1);
  TORCH_CHECK(dim % 2 == 0, "qkv_rope: the head size must be even, got ", dim);
  TORCH_CHECK(heads > 0 && kv_heads > 0 && qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(0) == tokens &&
                  qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "qkv_rope: qkv must be a contiguous [", tokens, ", (", heads, " + 2 * ", kv_heads, ") * ", dim, "]");
  const auto f32 = cos.options();
  at::Tensor q = at::empty({tokens, heads, dim}, f32), k = at::empty({tokens, kv_heads, dim}, f32);
  at::Tensor v = at::empty({tokens, kv_heads, dim}, f32);
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  if (qkv.scalar_type() == at::kFloat) {
    split_rotate(qkv.data_ptr<float>(), tokens, heads, kv_heads, dim, c, s, q.data_ptr<float>(), k.data_ptr<float>(),
                 v.data_ptr<float>());
  } else {
    split_rotate(qkv.data_ptr<at::BFloat16>(), tokens, heads, kv_heads, dim, c, s, q.data_ptr<float>(),
                 k.data_ptr<float>(), v.data_ptr<float>());
  }
  return {q, k, v};
}

// silu(gate) * up of a fused [..., 2I] gate_up output (float32 or bfloat16): silu as aten's kernel computes it (the
// same bits), the product per element as aten's mul computes it (bfloat16: in float, rounded to nearest even).
// float32 on an AVX-512 CPU runs aten's AVX-512 silu loop itself on each contiguous row, without its dispatch,
// narrow view and copy (~0.5-1 ms of a SmolLM2 float32 decode step between two weight streams): x / (1 + exp(-x)) by
// its SLEEF exp over each whole 32 elements, std::exp for the rest (tested bit for bit); elsewhere aten's silu.
KB_AVX512_TARGET void silu_mul_rows(const float* in, int64_t rows, int64_t width, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = in + r * 2 * width;
    const float* up = gate + width;
    float* o = out + r * width;
    int64_t j = 0;
    for (; j + 32 <= width; j += 32) {  // aten's vectorized_loop: two vectors a step, the same arithmetic per lane
      for (int64_t h = 0; h < 32; h += 16) {
        const __m512 x = _mm512_loadu_ps(gate + j + h);
        const __m512 act = _mm512_div_ps(x, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_xor_ps(sign, x))));
        _mm512_storeu_ps(o + j + h, _mm512_mul_ps(act, _mm512_loadu_ps(up + j + h)));
      }
    }
    for (; j < width; ++j) o[j] = (gate[j] / (1.0f + std::exp(-gate[j]))) * up[j];
  }
}

// Where aten itself runs its AVX-512 kernels (not on another CPU, nor under ATEN_CPU_CAPABILITY=avx2, whose loop
// steps by 16 and so rounds a row's tail differently): only there is silu_mul_rows its bits.
bool avx512_silu() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                                at::get_cpu_capability() == "AVX512";
  return supported;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "silu_mul: float32 or bfloat16 only");
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.is_contiguous() && gate_up.size(-1) % 2 == 0,
              "silu_mul: a contiguous [..., 2I] tensor only");
  const int64_t width = gate_up.size(-1) / 2;
  const int64_t rows = width == 0 ? 0 : gate_up.numel() / (2 * width);
  std::vector<int64_t> sizes = gate_up.sizes().vec();
  sizes.back() = width;
  at::Tensor out = at::empty(sizes, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat && avx512_silu()) {
    const float* in = gate_up.data_ptr<float>();
    float* o = out.data_ptr<float>();
    // a prompt's rows over the threads (aten's grain: 32768 elements a task); a decode row runs inline
    at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)), [&](int64_t r0, int64_t r1) {
      silu_mul_rows(in + r0 * 2 * width, r1 - r0, width, o + r0 * width);
    });
    return out;
  }
  const at::Tensor act = at::silu(gate_up.narrow(-1, 0, width)).contiguous();
  if (gate_up.scalar_type() == at::kFloat) {
    const float* a = act.data_ptr<float>();
    const float* in = gate_up.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j) o[r * width + j] = a[r * width + j] * in[r * 2 * width + width + j];
  } else {
    const at::BFloat16* a = act.data_ptr<at::BFloat16>();
    const at::BFloat16* in = gate_up.data_ptr<at::BFloat16>();
    at::BFloat16* o = out.data_ptr<at::BFloat16>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j)
        o[r * width + j] =
            at::BFloat16(static_cast<float>(a[r * width + j]) * static_cast<float>(in[r * 2 * width + width + j]));
  }
  return out;
}

// A linear as native code runs it: (weight, d, m, bits, n) -- qdot's codes and fp16 scales and offsets with bits 4
// or 8, or fdot's float32 panels with bits 32 (d and m unused) -- for N = n outputs.
struct NativeLinear {
  at::Tensor weight, d, m;
  int64_t bits, n;
  at::Tensor operator()(const at::Tensor& x) const {
    TORCH_CHECK(bits == 32 || weight.size(0) == n, "native linear: codes for ", weight.size(0), " rows, not ", n);
    return bits == 32 ? kernelbay::fdot(x, weight, n) : kernelbay::qdot(x, weight, d, m, bits);
  }
};

// y += r elementwise over two float32 tensors of one shape (aten's add, the same bits) without a dispatch: the residual
// adds of a layer's native path.
void add_into(at::Tensor& y, const at::Tensor& r) {
  float* yp = y.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] += rp[i];
}

// A pre-norm decoder layer's decode path on each side of its attention, for a layer whose four linears all run
// native kernels (kernelbay_engine.layers.fused): the calls the module path makes, in its order -- rms_norm, the qkv
// linear, qkv_rope; then x + o(attn), rms_norm, gate_up, silu_mul, + down -- so the same bits, in two native calls
// instead of ~15 Python-level ones a layer.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_in(const at::Tensor& x, const at::Tensor& norm, double eps,
                                                            const at::Tensor& w, const at::Tensor& d,
                                                            const at::Tensor& m, int64_t bits, int64_t n,
                                                            int64_t heads, int64_t kv_heads, const at::Tensor& cos,
                                                            const at::Tensor& sin) {
  const at::Tensor qkv = NativeLinear{w, d, m, bits, n}(rms_norm(x, norm, eps, false));
  return qkv_rope(qkv, heads, kv_heads, cos, sin);
}

at::Tensor attention_out_mlp(const at::Tensor& attn, const at::Tensor& x, const at::Tensor& o_w, const at::Tensor& o_d,
                             const at::Tensor& o_m, int64_t o_bits, int64_t o_n, const at::Tensor& norm, double eps,
                             const at::Tensor& gu_w, const at::Tensor& gu_d, const at::Tensor& gu_m, int64_t gu_bits,
                             int64_t gu_n, const at::Tensor& dn_w, const at::Tensor& dn_d, const at::Tensor& dn_m,
                             int64_t dn_bits, int64_t dn_n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2 && x.size(1) == o_n,
              "attention_out_mlp: x must be a contiguous float32 [T, ", o_n, "]");
  at::Tensor h = NativeLinear{o_w, o_d, o_m, o_bits, o_n}(attn);
  add_into(h, x);
  const at::Tensor gate_up = NativeLinear{gu_w, gu_d, gu_m, gu_bits, gu_n}(rms_norm(h, norm, eps, false));
  at::Tensor out = NativeLinear{dn_w, dn_d, dn_m, dn_bits, dn_n}(silu_mul(gate_up));
  TORCH_CHECK(out.sizes() == h.sizes(), "attention_out_mlp: down gives ", out.sizes(), ", the residual is ", h.sizes());
  add_into(out, h);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "float32 RMSNorm of the last dim (one call, aten's within rounding), bf16: out in bf16",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("bf16") = false);
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused [..., 2I] gate_up (one call)");
  m.def("qkv_rope", &qkv_rope, "q, k, v of a fused [T, (H + 2 Hk) * D] projection, q and k rotated (one call)");
  m.def("qdot_supported", &kernelbay::qdot_supported, "whether this CPU runs qdot (AVX-512 VNNI)");
  m.def("qdot", &kernelbay::qdot, "float32 x [M, K] times a packed 4/8-bit weight, int8 activations (qdot.cpp)");
  m.def("fdot_supported", &kernelbay::fdot_supported, "whether this CPU runs fdot (AVX-512 F and FMA)");
  m.def("fdot_pack", &kernelbay::fdot_pack, "a float32 weight [N, K] as fdot's panels [ceil(N / 16), K, 16]");
  m.def("fdot", &kernelbay::fdot, "float32 x [M, K] times a weight in fdot's panels, n outputs (fdot.cpp)");
  m.def("attention_in", &attention_in, "a decoder layer's norm, native qkv linear and RoPE (one call)");
  m.def("attention_out_mlp", &attention_out_mlp, "a decoder layer's o_proj, residual, norm and native MLP (one call)");
  m.def("rope", &rope, "float32 RoPE of [T, N, D] by [T, D] tables, every dim rotating (one call)");
}
