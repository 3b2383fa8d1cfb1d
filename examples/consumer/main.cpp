// A program outside zero.cpp that uses it as a library: a small MLP learns y = sin(3·x0) + x1·x2 on
// random points, data-parallel with ZeRO stage 2 over however many ranks mpirun starts. Each rank
// draws its own points; the optimizer averages gradients and keeps only this rank's Adam partition.
//   mpirun -np 2 ./mlp_zero        (exits 1 unless the loss fell at least 10x)
//   mpirun -np 2 ./mlp_zero 3      (another ZeRO stage; a bad one is the library's one-line error, exit 1)
// A zero::Error (any exception) from the library ends the job through dist::fail_job: one line for the
// whole job and exit code 1, where an uncaught exception would abort every rank.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <vector>

#include "autograd/ops.h"
#include "distributed/distributed.h"
#include "nn/layers.h"

using namespace zero;

struct MLP : nn::Module {
  explicit MLP(Generator& gen)
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(3, 64, true, gen, 0.5f))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(64, 1, true, gen, 0.1f))) {}
  Tensor forward(const Tensor& x) const { return fc2->forward(gelu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

int train(int stage) {
  auto world = dist::mpi_world();
  Generator init(42), data(1000 + world->rank());  // same weights everywhere, different points per rank
  MLP model(init);
  dist::ZeroOptions opts;
  opts.stage = stage;
  opts.adam.lr = 1e-2f;
  dist::ZeroOptimizer opt(model.named_parameters(), world, opts);
  double first = 0, loss_mean = 0;
  for (int step = 0; step < 300; ++step) {
    std::vector<float> x(32 * 3), y(32);
    for (float& v : x) v = 2 * data.uniform() - 1;
    for (int i = 0; i < 32; ++i) y[i] = std::sin(3 * x[3 * i]) + x[3 * i + 1] * x[3 * i + 2];
    const Tensor d = sub(model.forward(Tensor::from_vector(x, {32, 3})), Tensor::from_vector(y, {32, 1}));
    const Tensor loss = mean(mul(d, d));
    opt.backward(loss);
    opt.step();
    loss_mean = world->all_reduce_sum(loss.item()) / world->world_size();
    if (step == 0) first = loss_mean;
    if (world->rank() == 0 && (step % 100 == 0 || step == 299))
      std::printf("step %3d  mse %.4f  (%d ranks, ZeRO stage %d)\n", step, loss_mean, world->world_size(), opts.stage);
  }
  return loss_mean < first / 10 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return train(argc > 1 ? std::atoi(argv[1]) : 2);
  } catch (const std::exception& e) {
    dist::fail_job(e);  // prints "error: ..." once for the job, exits 1
  }
}
