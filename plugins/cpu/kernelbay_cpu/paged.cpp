// kernelbay-cpu's CPU_PAGED attention: a step's keys and values written into the paged cache, and causal attention
// of a request's few new tokens over its cached ones, each in one native call.
//
// Why native: a decode step of a small model attends in ~30 layers, each over a few hundred keys. In torch that is
// ~80 us a layer (a K/V scatter, views, SDPA's call with its checks and buffers), all of it cache-cold while the
// weights stream; the arithmetic itself is a few microseconds.
//
// Planes: [num_blocks, block_size, kv_heads, head_dim] views with any strides (the head_dim contiguous), so one kernel
// reads NHD and HND caches and the heads-outermost stride order alike. Queries, keys and values are float32, bfloat16
// or float16 (the cache's type may differ from the queries'); every product and sum is float32.
// Each (query, KV head) is one work item: the query heads sharing a KV head read each key once (two passes: the
// scores, then the values), and its arithmetic depends on its own query and keys alone -- a query gets the same bits
// whatever the batch, the thread, or how many of its request's tokens come in the same call (what lossless
// speculative verification needs).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KB_X86 1
#endif

namespace kernelbay {
namespace {

using c10::BFloat16;
using c10::Half;

template <typename T>
float dot_plain(const float* a, const T* b, int64_t d) {
  float acc = 0.f;
  for (int64_t i = 0; i < d; ++i) acc += a[i] * static_cast<float>(b[i]);
  return acc;
}

template <typename T>
void axpy_plain(float w, const T* x, float* y, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] += w * static_cast<float>(x[i]);
}

#ifdef KB_X86
#define KB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

KB_AVX512 __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// 16 (fewer past the mask) elements as float32 lanes
KB_AVX512 __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
KB_AVX512 __m512 load16(const BFloat16* p, __mmask16 m) {  // bfloat16 is float32's upper half
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
KB_AVX512 __m512 load16(const Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

template <typename T>
KB_AVX512 float dot_avx512(const float* a, const T* b, int64_t d) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load16(b + i, m), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <typename T>
KB_AVX512 void axpy_avx512(float w, const T* x, float* y, int64_t d) {
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(wv, load16(x + i, m), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}
#else
bool cpu_has_avx512() { return false; }
#endif

bool plain_only = false;  // set_plain(true): the portable loops even on an AVX-512 CPU (what tests check them by)

bool has_avx512() { return !plain_only && cpu_has_avx512(); }

template <typename T>
float dot(bool avx512, const float* a, const T* b, int64_t d) {
#ifdef KB_X86
  if (avx512) return dot_avx512(a, b, d);
#endif
  return dot_plain(a, b, d);
}

template <typename T>
void axpy(bool avx512, float w, const T* x, float* y, int64_t d) {
#ifdef KB_X86
  if (avx512) return axpy_avx512(w, x, y, d);
#endif
  axpy_plain(w, x, y, d);
}

void softmax_plain(float* s, int64_t n) {
  const float top = *std::max_element(s, s + n);
  float total = 0.f;
  for (int64_t j = 0; j < n; ++j) total += (s[j] = std::exp(s[j] - top));
  const float inv = 1.f / total;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

#ifdef KB_X86
// e^x for x <= 0 (a score minus the largest), 16 lanes: Cephes' expf (x = n ln2 + r, a degree-7 polynomial in r,
// scaled by 2^n), within ~2 ulp of std::exp; below -87.3 (under float's smallest normal) 0 or a denormal.
KB_AVX512 __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// s[0 .. n) <- softmax(s), 16 scores at a time (std::exp one at a time cost ~10 us a layer at SmolLM2's shape)
KB_AVX512 void softmax_avx512(float* s, int64_t n) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, s + j));
  }
  const __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), peak));
    _mm512_mask_storeu_ps(s + j, m, e);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv));
  }
}
#endif

void softmax(bool avx512, float* s, int64_t n) {
#ifdef KB_X86
  if (avx512) return softmax_avx512(s, n);
#endif
  softmax_plain(s, n);
}

// Keys (values) are read kAhead ahead: the cache is cold (a step's weights stream through the caches between two
// layers' attention), and a block's keys end at its page, where the hardware prefetcher stops.
constexpr int64_t kAhead = 8;

template <typename T>
void prefetch(const T* row, int64_t dim) {
#ifdef KB_X86
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < dim * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
#else
  __builtin_prefetch(row);
#endif
}

template <typename T>
struct Plane {
  T* data;
  int64_t block, offset, head;  // strides, in elements

  T* at(int64_t blk, int64_t off, int64_t h) const { return data + blk * block + off * offset + h * head; }
};

bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

void check_plane(const torch::Tensor& p, const char* name) {
  TORCH_CHECK(p.dim() == 4 && is_float_type(p.scalar_type()) && p.stride(3) == 1, "CPU_PAGED: ", name,
              " must be a float32, bfloat16 or float16 [num_blocks, block_size, kv_heads, head_dim] view with "
              "head_dim contiguous, got ", p.sizes(), " ", p.scalar_type());
}

template <typename T>
Plane<T> plane_of(const torch::Tensor& p) {
  return Plane<T>{reinterpret_cast<T*>(p.data_ptr()), p.stride(0), p.stride(1), p.stride(2)};
}

// [T, heads, dim] rows with the last dim contiguous (a view into a fused projection's output is fine)
void check_rows(const torch::Tensor& x, const char* name, int64_t heads, int64_t dim) {
  TORCH_CHECK(x.dim() == 3 && is_float_type(x.scalar_type()) && x.size(1) == heads && x.size(2) == dim &&
                  x.stride(2) == 1,
              "CPU_PAGED: ", name, " must be float32, bfloat16 or float16 [T, ", heads, ", ", dim,
              "] with the last dim contiguous, got ", x.sizes(), " ", x.scalar_type());
}

// f(T{}) with T the C++ type of `type` (float, BFloat16, Half)
template <typename F>
void with_type(at::ScalarType type, F&& f) {
  switch (type) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(BFloat16{}); break;
    case at::kHalf: f(Half{}); break;
    default: TORCH_CHECK(false, "CPU_PAGED: unsupported type ", type);
  }
}

struct Step {  // one step's request layout, host pointers into the metadata tensors
  const int32_t* table;
  const int32_t* start;
  const int32_t* lens;
  int64_t width;
};

// Which keys a query sees: up to its own position (causal), the last `window` of them, those of its own chunk.
struct Visible {
  bool causal;
  int64_t window, chunk;  // 0: none

  // [first, last) of the keys of a request of `seq` keys for its query at `pos`
  std::pair<int64_t, int64_t> range(int64_t pos, int64_t seq) const {
    int64_t first = 0, last = causal ? pos + 1 : seq;
    if (window > 0) first = std::max(first, pos - window + 1);
    if (chunk > 0) {
      first = std::max(first, pos / chunk * chunk);
      last = std::min(last, (pos / chunk + 1) * chunk);
    }
    return {first, std::max(first, last)};
  }
};

template <typename Q, typename C>
void attend_items(const torch::Tensor& q, const torch::Tensor& k_plane, const torch::Tensor& v_plane, const Step& step,
                  const std::vector<int64_t>& tokens, const std::vector<int64_t>& token_req, float scale,
                  const Visible& visible, torch::Tensor& out) {
  const Plane<C> kp = plane_of<C>(k_plane), vp = plane_of<C>(v_plane);
  const int64_t kv_heads = k_plane.size(2), dim = k_plane.size(3), block_size = k_plane.size(1);
  const int64_t heads = q.size(1), group = heads / kv_heads;
  const Q* qs = reinterpret_cast<const Q*>(q.data_ptr());
  const int64_t q_row = q.stride(0), q_head = q.stride(1);
  Q* os = reinterpret_cast<Q*>(out.data_ptr());
  const bool avx512 = has_avx512();
  const int64_t items = static_cast<int64_t>(tokens.size()) * kv_heads;
  at::parallel_for(0, items, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> scores, query(group * dim), acc(group * dim);
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t t = tokens[item / kv_heads], h = item % kv_heads, r = token_req[item / kv_heads];
      const int64_t seq = step.lens[r];
      const auto [first, last] = visible.range(seq - (step.start[r + 1] - t), seq);
      const int64_t n = last - first;
      const int32_t* row = step.table + r * step.width;
      auto key_at = [&](const Plane<C>& plane, int64_t j) { return plane.at(row[j / block_size], j % block_size, h); };
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = 0; i < dim; ++i)
          query[g * dim + i] = static_cast<float>(qs[t * q_row + (h * group + g) * q_head + i]);
      scores.resize(group * n);
      for (int64_t j = first; j < last; ++j) {
        if (j + kAhead < last) prefetch(key_at(kp, j + kAhead), dim);
        const C* key = key_at(kp, j);
        for (int64_t g = 0; g < group; ++g)
          scores[g * n + j - first] = dot(avx512, query.data() + g * dim, key, dim) * scale;
      }
      for (int64_t g = 0; g < group && n > 0; ++g) softmax(avx512, scores.data() + g * n, n);
      std::fill(acc.begin(), acc.end(), 0.f);  // a query that sees no key (never in a model) gets zeros
      for (int64_t j = first; j < last; ++j) {
        if (j + kAhead < last) prefetch(key_at(vp, j + kAhead), dim);
        const C* value = key_at(vp, j);
        for (int64_t g = 0; g < group; ++g) axpy(avx512, scores[g * n + j - first], value, acc.data() + g * dim, dim);
      }
      for (int64_t g = 0; g < group; ++g) {
        Q* o = os + (t * heads + h * group + g) * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = static_cast<Q>(acc[g * dim + i]);
      }
    }
  });
}

}  // namespace

// k/v [T, kv_heads, D] written at the flat slots [T] (block * block_size + offset) of the two planes (same type).
void write_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor k_plane, torch::Tensor v_plane,
              const torch::Tensor& slots) {
  check_plane(k_plane, "k_plane");
  check_plane(v_plane, "v_plane");
  const int64_t heads = k_plane.size(2), dim = k_plane.size(3), block_size = k_plane.size(1);
  const int64_t capacity = k_plane.size(0) * block_size;
  check_rows(k, "k", heads, dim);
  check_rows(v, "v", heads, dim);
  TORCH_CHECK(k.scalar_type() == k_plane.scalar_type() && v.scalar_type() == v_plane.scalar_type() &&
                  k_plane.scalar_type() == v_plane.scalar_type(),
              "CPU_PAGED: k, v and the cache must have one type, got ", k.scalar_type(), ", ", v.scalar_type(),
              " and ", k_plane.scalar_type());
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.dim() == 1 && slots.size(0) == k.size(0),
              "CPU_PAGED: slots must be int64 [T]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t bytes = dim * k.element_size(), element = k.element_size();
  const char* ks = static_cast<const char*>(k.data_ptr());
  const char* vs = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_plane.data_ptr());
  char* vc = static_cast<char*>(v_plane.data_ptr());
  for (int64_t t = 0; t < k.size(0); ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < capacity, "CPU_PAGED: slot ", slot[t], " is outside the cache (",
                capacity, " slots)");
    const int64_t blk = slot[t] / block_size, off = slot[t] % block_size;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kc_at = blk * k_plane.stride(0) + off * k_plane.stride(1) + h * k_plane.stride(2);
      const int64_t vc_at = blk * v_plane.stride(0) + off * v_plane.stride(1) + h * v_plane.stride(2);
      std::memcpy(kc + kc_at * element, ks + (t * k.stride(0) + h * k.stride(1)) * element, bytes);
      std::memcpy(vc + vc_at * element, vs + (t * v.stride(0) + h * v.stride(1)) * element, bytes);
    }
  }
}

// out[t] for every token t of the requests `reqs` (int64 ids): q[t] over its request's keys 0 .. its position
// (causal; else every key), the last `window` of them and those of its `chunk` only (0: no window, no chunks), read
// through the request's row of block_tables. query_start [B + 1] and seq_lens [B] are int32.
void attend(const torch::Tensor& q, const torch::Tensor& k_plane, const torch::Tensor& v_plane,
            const torch::Tensor& block_tables, const torch::Tensor& query_start, const torch::Tensor& seq_lens,
            const torch::Tensor& reqs, double scale, bool causal, int64_t window, int64_t chunk, torch::Tensor out) {
  check_plane(k_plane, "k_plane");
  check_plane(v_plane, "v_plane");
  TORCH_CHECK(k_plane.scalar_type() == v_plane.scalar_type(), "CPU_PAGED: the key and value planes differ in type");
  const int64_t kv_heads = k_plane.size(2), dim = k_plane.size(3), block_size = k_plane.size(1);
  TORCH_CHECK(q.dim() == 3 && q.size(1) % kv_heads == 0, "CPU_PAGED: q must be [T, heads, D] with heads a multiple "
              "of the cache's ", kv_heads, " KV heads, got ", q.sizes());
  const int64_t heads = q.size(1);
  check_rows(q, "q", heads, dim);
  check_rows(out, "out", heads, dim);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == q.scalar_type(),
              "CPU_PAGED: out must be contiguous, of q's type");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && query_start.scalar_type() == torch::kInt32 &&
                  seq_lens.scalar_type() == torch::kInt32 && reqs.scalar_type() == torch::kInt64 &&
                  block_tables.is_contiguous(),
              "CPU_PAGED: block_tables, query_start and seq_lens must be int32 (contiguous), reqs int64");
  const int32_t* table = block_tables.data_ptr<int32_t>();
  const int32_t* start = query_start.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* req = reqs.data_ptr<int64_t>();
  const int64_t width = block_tables.size(1), num_blocks = k_plane.size(0);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == seq_lens.size(0) &&
                  query_start.size(0) == seq_lens.size(0) + 1 && start[seq_lens.size(0)] == q.size(0),
              "CPU_PAGED: block_tables [B, W], query_start [B + 1] (ending at T) and seq_lens [B] disagree");

  // the chosen requests' tokens, each checked against its block table once (the loops below trust them)
  std::vector<int64_t> token_req;
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < reqs.size(0); ++i) {
    const int64_t r = req[i];
    TORCH_CHECK(r >= 0 && r < seq_lens.size(0), "CPU_PAGED: request ", r, " is not in the step");
    const int64_t new_tokens = start[r + 1] - start[r];
    TORCH_CHECK(new_tokens >= 0 && lens[r] >= new_tokens && lens[r] <= width * block_size, "CPU_PAGED: request ", r,
                " has ", new_tokens, " new token(s) and ", lens[r], " keys, which its block table of ", width,
                " blocks cannot hold");
    for (int64_t b = 0; b * block_size < lens[r]; ++b)
      TORCH_CHECK(table[r * width + b] >= 0 && table[r * width + b] < num_blocks, "CPU_PAGED: request ", r,
                  "'s block ", b, " is ", table[r * width + b], ", outside the cache's ", num_blocks, " blocks");
    for (int64_t t = start[r]; t < start[r + 1]; ++t) {
      tokens.push_back(t);
      token_req.push_back(r);
    }
  }
  TORCH_CHECK(window >= 0 && chunk >= 0, "CPU_PAGED: window and chunk are sizes (0: none)");
  const Step step{table, start, lens, width};
  const Visible visible{causal, window, chunk};
  with_type(q.scalar_type(), [&](auto q_type) {
    with_type(k_plane.scalar_type(), [&](auto c_type) {
      attend_items<decltype(q_type), decltype(c_type)>(q, k_plane, v_plane, step, tokens, token_req,
                                                       static_cast<float>(scale), visible, out);
    });
  });
}

bool set_plain(bool plain) {
  const bool before = plain_only;
  plain_only = plain;
  return before;
}

bool uses_avx512() { return has_avx512(); }

}  // namespace kernelbay

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("write_kv", &kernelbay::write_kv, "a step's k/v [T, kv_heads, D] into the paged planes at flat slots [T]");
  m.def("attend", &kernelbay::attend,
        "attention of the chosen requests' tokens over their paged keys (causal, a window, chunks), into out");
  m.def("set_plain", &kernelbay::set_plain, "true: the portable loops even where AVX-512 runs; returns the old value");
  m.def("uses_avx512", &kernelbay::uses_avx512, "whether attend's products run on AVX-512 (else portable loops)");
}
