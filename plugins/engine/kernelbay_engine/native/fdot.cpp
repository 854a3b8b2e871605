// kernelbay-engine's float32 linear: y = x w^T for a float32 weight packed once into column panels, by AVX-512 FMA.
// What a float32 model's decode step spends most of its time in: at one row each weight is read once and used once,
// so the product runs at the speed the weights stream from memory, and a panel is one sequential stream.
//
// Packed layout (fdot_pack): w [N, K] as panels [ceil(N / 16), K, 16], panel p's row k = w[16p .. 16p + 16, k]
// (zero past N). A tile of R activation rows x 2 panels keeps 2R accumulators of 16 outputs: per k two panel rows
// are loaded and each x[r, k] broadcast into them (no horizontal sums). y[m, n] is the FMA chain over k = 0 .. K-1
// in order: its bits depend on x[m] and w[n] alone, not on the batch it runs in or the thread computing it.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

namespace kernelbay {
namespace {

#define KB_FMA_TARGET __attribute__((target("avx512f,fma")))

constexpr int64_t kLanes = 16;   // outputs a panel
constexpr int64_t kPanels = 2;   // panels a tile: with 8 rows, 16 accumulators
constexpr int64_t kAhead = 64;   // panel rows (64 bytes each) prefetched ahead of each stream: 8-128 tried

template <int Rows, int Panels>
KB_FMA_TARGET void tile(const float* x, const float* w, int64_t k, int64_t p0, int64_t r0, int64_t n, float* y) {
  __m512 acc[Rows][Panels];
  for (int r = 0; r < Rows; ++r)
    for (int p = 0; p < Panels; ++p) acc[r][p] = _mm512_setzero_ps();
  const float* panel = w + p0 * k * kLanes;
  const float* xr = x + r0 * k;
  for (int64_t j = 0; j < k; ++j) {
    __m512 wv[Panels];
    for (int p = 0; p < Panels; ++p) {
      const float* row = panel + (p * k + j) * kLanes;
      _mm_prefetch(reinterpret_cast<const char*>(row + kAhead * kLanes), _MM_HINT_T0);
      wv[p] = _mm512_loadu_ps(row);
    }
    for (int r = 0; r < Rows; ++r) {
      const __m512 xb = _mm512_set1_ps(xr[r * k + j]);
      for (int p = 0; p < Panels; ++p) acc[r][p] = _mm512_fmadd_ps(wv[p], xb, acc[r][p]);
    }
  }
  for (int p = 0; p < Panels; ++p) {
    const int64_t col = (p0 + p) * kLanes;
    const int64_t left = n - col;
    const __mmask16 mask = left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
    for (int r = 0; r < Rows; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * n + col, mask, acc[r][p]);
  }
}

template <int Panels>
void panel_tile(const float* x, const float* w, int64_t rows, int64_t k, int64_t p0, int64_t n, float* y) {
  int64_t r = 0;  // the panels stay in cache across the row tiles
  for (; r + 8 <= rows; r += 8) tile<8, Panels>(x, w, k, p0, r, n, y);
  for (; r + 4 <= rows; r += 4) tile<4, Panels>(x, w, k, p0, r, n, y);
  for (; r + 2 <= rows; r += 2) tile<2, Panels>(x, w, k, p0, r, n, y);
  for (; r < rows; ++r) tile<1, Panels>(x, w, k, p0, r, n, y);
}

// Memory for a large weight on 2 MiB pages where the kernel grants them (transparent huge pages in "madvise" mode):
// a weight streamed from memory every step then costs a TLB miss per 2 MiB rather than per 4 KiB, and the
// prefetchers' 4 KiB page limit stops mattering. SmolLM2-135M's 30 layers at one row, a scratch A/B on the same
// panels: 7.9 ms best / 8.8 median against 9.0 / 9.8 on 4 KiB pages. Only advice: where refused, the same memory on 4 KiB pages.
constexpr size_t kHugePage = size_t{2} << 20;

at::Tensor empty_on_huge_pages(at::IntArrayRef sizes) {
  int64_t numel = 1;
  for (const int64_t size : sizes) numel *= size;
  const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
  void* memory = nullptr;
  if (bytes < kHugePage || posix_memalign(&memory, kHugePage, bytes) != 0) return at::empty(sizes, at::kFloat);
  madvise(memory, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // before the first touch: faulted in as 2 MiB
  return at::from_blob(memory, sizes, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

bool fdot_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  }();
  return supported;
}

// The panels of a float32 weight [N, K] (see the layout above), written directly: no padded or transposed copy of a
// large weight (a tied LM head) on the way.
at::Tensor fdot_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "fdot_pack: w must be float32 [N, K]");
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), count = (n + kLanes - 1) / kLanes;
  at::Tensor panels = empty_on_huge_pages({count, k, kLanes});
  const float* src = w.data_ptr<float>();
  float* dst = panels.data_ptr<float>();
  at::parallel_for(0, count, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        const int64_t row = p * kLanes + lane;
        float* out = dst + p * k * kLanes + lane;
        for (int64_t j = 0; j < k; ++j) out[j * kLanes] = row < n ? src[row * k + j] : 0.0f;
      }
  });
  return panels;
}

// y [M, n] float32 = x [M, K] float32 times the weight whose panels [P, K, 16] fdot_pack made (n of its P * 16 rows).
at::Tensor fdot(const at::Tensor& x, const at::Tensor& panels, int64_t n) {
  TORCH_CHECK(fdot_supported(), "fdot: this CPU lacks AVX-512");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "fdot: x must be contiguous float32 [M, K]");
  TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.dim() == 3 && panels.size(2) == kLanes && panels.is_contiguous(),
              "fdot: the weight must be fdot_pack's contiguous float32 [P, K, 16]");
  TORCH_CHECK(x.size(1) == panels.size(1), "fdot: x has K = ", x.size(1), ", the weight ", panels.size(1));
  TORCH_CHECK(n > (panels.size(0) - 1) * kLanes && n <= panels.size(0) * kLanes, "fdot: ", panels.size(0),
              " panels hold ", (panels.size(0) - 1) * kLanes + 1, " to ", panels.size(0) * kLanes, " rows, not ", n);
  const int64_t rows = x.size(0), k = x.size(1), count = panels.size(0);
  at::Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // a task of 2 panels (32 outputs) at least: a parallel region costs a few us, a panel of a small layer ~0.2 us
  at::parallel_for(0, count, kPanels, [&](int64_t p0, int64_t p1) {
    int64_t p = p0;
    for (; p + kPanels <= p1; p += kPanels) panel_tile<kPanels>(xp, wp, rows, k, p, n, yp);
    for (; p < p1; ++p) panel_tile<1>(xp, wp, rows, k, p, n, yp);
  });
  return y;
}

}  // namespace kernelbay
