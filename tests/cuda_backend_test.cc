// The CUDA backend as a machine without a GPU sees it (runs everywhere; not a gpu test): a CUDA build
// registers a backend that describes its toolkit and architectures and answers "no GPU" without
// crashing; a build without CUDA has no backend and says so when a tensor is sent to a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "build_info.h"
#include "tensor/kernels.h"
#include "tensor/slots/attention/attention.h"
#include "tensor/slots/attention/relative_position_bias.h"
#include "tensor/slots/delta/delta_net.h"
#include "tensor/slots/linear/linear_attention.h"
#include "tensor/slots/optim.h"
#include "tensor/slots/scan/gla.h"

namespace seqlab {
namespace {

constexpr bool kBuiltWithCuda = SEQLAB_BUILT_WITH_CUDA;

// "13.0.88" -> "13.0"
std::string major_minor(const std::string& version) {
  return version.substr(0, version.find('.', version.find('.') + 1));
}

std::string error_of_moving_to_gpu() {
  try {
    kernel::to_device(Tensor::ones({3}), cuda_device(0));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CudaBackend, RegisteredExactlyWhenBuiltWithCuda) {
  if (!kBuiltWithCuda) {
    EXPECT_EQ(cuda_backend(), nullptr);
    EXPECT_FALSE(cuda_available());
    std::string msg = error_of_moving_to_gpu();
    EXPECT_NE(msg.find("no CUDA backend"), std::string::npos) << msg;
    return;
  }
  DeviceBackend* backend = cuda_backend();
  ASSERT_NE(backend, nullptr);
  const std::string text = backend->describe();
  EXPECT_NE(text.find("CUDA toolkit " + major_minor(SEQLAB_CUDA_TOOLKIT)), std::string::npos) << text;
  const std::string archs = SEQLAB_CUDA_ARCHS;  // "80,90"
  for (size_t start = 0; start < archs.size();) {
    size_t end = std::min(archs.find(',', start), archs.size());
    EXPECT_NE(text.find("sm_" + archs.substr(start, end - start)), std::string::npos) << text;
    start = end + 1;
  }
  EXPECT_NE(text.find("NCCL 2."), std::string::npos) << text;
}

TEST(CudaBackend, AnswersWhetherAGpuIsThereWithoutCrashing) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "built without CUDA";
  DeviceBackend* backend = cuda_backend();
  ASSERT_NE(backend, nullptr);
  const bool available = cuda_available();
  EXPECT_EQ(available, backend->available());
  EXPECT_EQ(available, backend->device_count() > 0);
  const std::string text = backend->describe();
  if (available) {
    EXPECT_EQ(text.find("no usable GPU"), std::string::npos) << text;
    EXPECT_EQ(error_of_moving_to_gpu(), "");
  } else {
    EXPECT_NE(text.find("no usable GPU"), std::string::npos) << text;
    std::string msg = error_of_moving_to_gpu();
    EXPECT_NE(msg.find("no usable CUDA device"), std::string::npos) << msg;
  }
  // A device that does not exist is named in the error, whatever the machine.
  try {
    Tensor::empty({1}, DType::f32, cuda_device(backend->device_count() + 3));
    ADD_FAILURE() << "allocating on a missing device did not throw";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::transform(msg.begin(), msg.end(), msg.begin(), [](unsigned char c) { return std::tolower(c); });
    EXPECT_NE(msg.find("cuda"), std::string::npos) << e.what();
  }
}

// A slot is an inline variable declared in a src/tensor header; the tensor, cuda and layers libraries
// and this test each see it, and must all see the one instance: the registrations made by the CPU
// kernels (src/tensor/cpu, src/layers) and by the CUDA kernels (src/cuda) are visible here, for slots
// of every kind of header.
template <class Slot>
void expect_filled(const Slot& slot) {
  EXPECT_TRUE(slot.has(DeviceType::CPU)) << slot.name << " has no CPU kernel";
  EXPECT_EQ(slot.has(DeviceType::CUDA), kBuiltWithCuda) << slot.name;
}

TEST(CudaBackend, EverySlotSeesTheKernelsEveryLibraryRegistered) {
  expect_filled(kernel::copy_kernel);
  expect_filled(kernel::gemm_kernel);
  expect_filled(kernel::cross_entropy_kernel);
  expect_filled(kernel::adamw_step_kernel);
  expect_filled(kernel::sum_squares_kernel);
  expect_filled(kernel::attention_forward_kernel);
  expect_filled(kernel::relative_position_bias_forward_kernel);
  expect_filled(kernel::relative_position_bias_backward_kernel);
  expect_filled(kernel::gla_backward_kernel);
  expect_filled(kernel::linear_attention_forward_kernel);
  expect_filled(kernel::delta_net_backward_kernel);
}

}  // namespace
}  // namespace seqlab
