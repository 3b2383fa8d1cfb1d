// docs/adding_a_layer.md against the tree. Every code block of the guide is marked
// `<!-- excerpt: PATH -->` and must appear verbatim in that file, so the code it shows is code that
// builds (and runs in the tests) here. And the guide's reason to fuse beyond speed: silu composed from
// exp and div has NaN gradients once exp(-z) overflows f32, below z = -ln(FLT_MAX) = -88.72.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"

namespace zero {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string root() { return std::string(ZERO_TEST_DATA_DIR) + "/../.."; }

TEST(AddingALayerGuide, EveryCodeBlockIsAnExcerptOfTheFileItNames) {
  std::istringstream doc(read_file(root() + "/docs/adding_a_layer.md"));
  std::string line, previous, marker = "<!-- excerpt: ";
  int blocks = 0;
  while (std::getline(doc, line)) {
    if (line.rfind("```", 0) != 0) {
      if (!line.empty()) previous = line;
      continue;
    }
    // An opening fence: the last non-empty line before it names the file.
    std::string block;
    for (std::string l; std::getline(doc, l) && l.rfind("```", 0) != 0;) block += l + "\n";
    ++blocks;
    ASSERT_EQ(previous.rfind(marker, 0), 0u) << "block " << blocks << " has no excerpt marker:\n" << block;
    const std::string path = previous.substr(marker.size(), previous.find(" -->") - marker.size());
    EXPECT_NE(read_file(root() + "/" + path).find(block), std::string::npos)
        << "block " << blocks << " is not in " << path << ":\n"
        << block;
    previous.clear();
  }
  EXPECT_GE(blocks, 8);
}

// silu(z) = z / (1 + exp(-z)) from ops: for z < -88.72, exp(-z) is +inf, the forward is -0 (right),
// and the backward of exp multiplies the incoming 0 by exp's output, inf: NaN. A fused kernel that
// writes the derivative as sigmoid(z) (1 + z (1 - sigmoid(z))) has no such product.
TEST(AddingALayerGuide, ComposedSiluHasNanGradientsWhereExpOverflows) {
  for (float z : {-80.0f, -88.7f, -88.8f, -100.0f}) {
    Tensor x = Tensor::from_vector({z}, {1});
    x.set_requires_grad(true);
    const Tensor y = div(x, add(exp(mul(x, -1.0f)), 1.0f));
    EXPECT_LT(std::abs(y.item()), 1e-30f) << z;  // the forward is right: silu(z) is about z e^z
    sum(y).backward();
    const float g = x.grad().item();
    if (z >= -88.7f) {
      EXPECT_TRUE(std::isfinite(g)) << z << ": " << g;
    } else {
      EXPECT_TRUE(std::isnan(g)) << z << ": " << g;
    }
  }
}

}  // namespace
}  // namespace zero
