// core/ on its own: this binary links zero_core and nothing from autograd/, nn/, optim/ or
// distributed/ (tests/CMakeLists.txt), so it fails to link if core/ calls into a layer above it.
// Tensors, views, copies between dtypes, the CPU kernels and gradients set by hand work; what needs the
// autograd engine says so in one line (Note [Autograd behind an interface] in core/autograd_interface.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd_interface.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace zero {
namespace {

TEST(CoreAlone, AutogradIsNotInstalled) { EXPECT_EQ(detail::autograd_interface(), nullptr); }

TEST(CoreAlone, ViewsCopiesAndConversions) {
  const Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor t = a.transpose(0, 1);  // [3, 2], strided
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().to_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(a.view({3, 2}).narrow(0, 1, 2).to_vector(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(a.narrow(1, 2, 1).expand({2, 4}).to_vector(), (std::vector<float>{3, 3, 3, 3, 6, 6, 6, 6}));
  // 0.1 is not an f16 value: to(f16) rounds it to the nearest one, 1638 * 2^-14.
  const Tensor h = Tensor::full({3}, 0.1f).to(DType::f16);
  EXPECT_EQ(h.to(DType::f32).item_at(0), 0.0999755859375f);
  Tensor z = Tensor::zeros({2, 3});
  z.transpose(0, 1).copy_(t);  // through two strided views: z = a
  EXPECT_EQ(z.to_vector(), a.to_vector());
  z.narrow(1, 0, 1).fill_(-1.0f);
  EXPECT_EQ(z.to_vector(), (std::vector<float>{-1, 2, 3, -1, 5, 6}));
}

TEST(CoreAlone, CpuKernels) {
  // [2, 3] @ [3, 2] against the sums written out.
  const std::vector<float> A{1, 2, 3, 4, 5, 6}, B{1, 0, 0, 1, 1, 1};
  std::vector<float> C(4, -7.0f);  // garbage: beta == 0 must not read it
  kernels(Device::cpu).gemm(false, false, 2, 2, 3, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2, nullptr);
  EXPECT_EQ(C, (std::vector<float>{1 + 3, 2 + 3, 4 + 6, 5 + 6}));
  EXPECT_EQ(kernels(Device::cpu).sum_squares(A.data(), DType::f32, 6), 91.0);
}

// Gradients a program sets itself work (an optimizer needs nothing more); the engine does not.
TEST(CoreAlone, AutogradStateWithoutTheEngine) {
  Tensor x = Tensor::ones({2});
  EXPECT_FALSE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(x.grad().defined());
  x.set_requires_grad(true);
  EXPECT_TRUE(x.requires_grad());
  x.set_grad(Tensor::full({2}, 0.5f));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0.5f, 0.5f}));
  const Tensor v = x.view({1, 2});  // a plain view: there is no graph without the engine
  EXPECT_EQ(v.to_vector(), x.to_vector());
  EXPECT_FALSE(v.requires_grad());
  try {
    x.backward();
    ADD_FAILURE() << "backward without autograd did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("autograd/ is not linked"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero
