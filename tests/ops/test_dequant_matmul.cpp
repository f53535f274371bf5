// The exact path's products. GEMV (dispatch::dequant_gemv, kernels/matmul/dequant-inl.h): for one row of x (M = 1),
// dequant_matmul feeds each dequantized block from registers into the FMAs instead of through a tile. It promises the
// bits of the tile path: the weights as the scalar reference dequantizes them (bit for bit gguf-py's, as is
// dispatch::dequant_rows: tests/quant/test_dequant.cpp) multiplied by kiln's f32 GEMV (matmul with M <= 4,
// checked against Eigen in test_matmul.cpp). Checked here bit for bit, on every target, for every type with a kernel and
// two without (Q3_K and MXFP4, which take the tile path), row-major and interleaved, M = 1..4, strided x and y,
// 1 and 2 threads, and a row count that leaves a partial group, partial batches and a row-major tail.
// GEMM (M > 4, dispatch::matmul_dequant): kiln's blocked f32 GEMM with each B panel dequantized as it is packed
// (dispatch::dequant_block) promises the bits of that GEMM on the whole dequantized matrix: checked the same
// way, with K over several K blocks.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "test_util.hpp"
#include "weights_util.hpp"

using namespace kiln;

namespace {

ThreadPool& dm_pool2() {
  static ThreadPool p(2);
  return p;
}

bool dm_same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const uint32_t kDmTypes[] = {ggml_type_id::Q4_0, ggml_type_id::Q4_1, ggml_type_id::Q5_0, ggml_type_id::Q5_1,
                             ggml_type_id::Q8_0, ggml_type_id::Q4_K, ggml_type_id::Q5_K, ggml_type_id::Q6_K,
                             ggml_type_id::Q3_K, ggml_type_id::MXFP4};

/// For every type of kDmTypes, n weight rows of k_of(block size) values, every target and each m of ms:
/// dequant_matmul (row-major and, where the type has it, interleaved; 1 and 2 threads; strided x and y) equals,
/// bit for bit, the scalar reference dequantization followed by kiln::matmul.
template <class KOf>
void dm_check_all(std::size_t n, KOf k_of, std::initializer_list<std::size_t> ms, uint32_t seed) {
  const std::size_t max_m = std::max(ms);
  for (const uint32_t type : kDmTypes) {
    std::size_t bs = 0;
    visit_ggml_type(type, [&]<class T>(T*) { bs = dtype_traits<T>::block_size; });
    const std::size_t k = k_of(bs), lda = k + 5, ldc = n + 3;
    INFO("type ", io::ggml_type_name(io::GGMLType(type)), " k ", k);
    const auto w = test::random_weights(type, n, k, seed + type, /*extremes=*/true);
    REQUIRE(w.size() == n * ggml_row_bytes(type, k));
    std::vector<uint8_t> wi;  // the same weights in 16-row interleaved groups
    visit_ggml_type(type, [&]<class T>(T*) {
      if constexpr (kernels::qmm_interleavable_v<T>) {
        wi = w;
        kernels::qmm_interleave_rows_in_place(reinterpret_cast<T*>(wi.data()), n, k / bs);
      }
    });
    const auto x = test::random_floats(max_m * lda, 100 + seed + type);
    std::vector<float> wf(n * k);  // the weights by the scalar reference (as dispatch::dequant_rows gives them)
    for (std::size_t r = 0; r < n; ++r)
      dequantize_row(type, w.data() + r * ggml_row_bytes(type, k), wf.data() + r * k, k);
    test::for_each_target([&](const std::string&) {
      for (const std::size_t m : ms) {
        INFO("m ", m);
        const auto xv = make_strided<const float, 2>(x.data(), {m, k}, {std::ptrdiff_t(lda), 1});
        std::vector<float> want(m * ldc, -7.0f);  // the padding past each row of y must stay
        matmul(xv, make_tensor<const float>(wf.data(), n, k),
               make_strided<float, 2>(want.data(), {m, n}, {std::ptrdiff_t(ldc), 1}));
        for (const bool inter : {false, true}) {
          if (inter && wi.empty()) continue;
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &dm_pool2()}) {
            const std::string what = std::string(inter ? "interleaved" : "row-major") + ", threads " +
                                     std::to_string(pool ? pool->size() : 1);
            INFO(what);
            std::vector<float> got(m * ldc, -7.0f);
            kernels::dequant_matmul(xv, type, inter ? wi.data() : w.data(), n, 0,
                                    make_strided<float, 2>(got.data(), {m, n}, {std::ptrdiff_t(ldc), 1}), pool,
                                    {.interleaved = inter});
            CHECK(dm_same(got, want));
          }
        }
      }
    });
  }
}

}  // namespace

TEST_CASE(
    "dequant_matmul, M <= 4: the fused GEMV gives the tile path's bits (reference dequantization, then the f32 GEMV)") {
  // 45 rows: two interleaved groups and 13 row-major ones; not a multiple of any batch (8, 4, 2). Q3_K has no
  // kernel: the tile path.
  dm_check_all(
      45, [](std::size_t bs) { return 3 * bs; }, {1, 2, 3, 4}, 7);
}

TEST_CASE(
    "dequant_matmul, M > 4: the GEMM over panels dequantized as they are packed gives the bits of the f32 GEMM on the "
    "reference dequantization") {
  // 77 rows: four interleaved groups and a 13-row row-major tail; 2 threads split them at row 64. K spans
  // several K blocks of the GEMM (256 values on AVX-512, 512 on AVX2) and ends in a partial one for the
  // 32-value types (576 = 2 x 256 + 64). Q3_K: the scalar reference per panel.
  dm_check_all(
      77, [](std::size_t bs) { return bs == 32 ? std::size_t(576) : std::size_t(768); }, {5, 13, 29}, 11);
}
