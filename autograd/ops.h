// Differentiable operations, each defined once for every device. An op validates its inputs, picks
// the backend of the device they live on (core/backend.h: kernels in core/cpu/ and core/cuda/), calls
// its kernels, and records its backward (autograd/autograd.h) a few lines below, in the same file; the
// backward runs on the same device through the same kernels. All inputs of one op must be on one device
// (zero::Error naming the op and both devices otherwise), and outputs and gradients stay there; a kernel
// a device lacks is a one-line zero::Error naming the kernel and the device (Note [Missing kernels]).
// All float ops take f32 inputs (convert f16/bf16 tensors with .to(DType::f32) first, which is
// differentiable), except the 16-bit operands of the GEMM ops below; they throw zero::Error for other
// dtypes and for mismatched shapes, naming both shapes.
//
// The ops are declared by family, one header each, so that a file includes (and is rebuilt for) only
// the families it uses: autograd/ops_elementwise.h, autograd/ops_reduce.h, autograd/ops_linalg.h,
// autograd/ops_nn.h; the f32 compute copies of 16-bit parameters are in autograd/compute_copy.h. A new
// op goes into its family's header (a new family is a new header, added here), and into ops.cpp.
// This header includes them all.
#pragma once

#include "autograd/compute_copy.h"
#include "autograd/ops_detail.h"
#include "autograd/ops_elementwise.h"
#include "autograd/ops_linalg.h"
#include "autograd/ops_nn.h"
#include "autograd/ops_reduce.h"
