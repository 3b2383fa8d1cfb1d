// gpu_probe: what scripts/gpu_check.sh asks a machine before it builds or runs anything there. Prints
// one JSON object on stdout:
//   driver_cuda_version    the newest CUDA version the installed driver supports (cudaDriverGetVersion,
//                          1000 * major + 10 * minor; 0 when no driver is installed),
//   runtime_cuda_version   the CUDA runtime this probe was built with, i.e. the toolkit the project
//                          is built with (cudaRuntimeGetVersion, same encoding),
//   device_count, error    cudaGetDeviceCount's count and, when it fails, the error's name,
//   devices                name, compute capability and memory of each device,
//   nccl_version, nccl_library   ncclGetVersion (10000 * major + 100 * minor + patch since NCCL 2.9) of
//                          the libnccl.so.2 the dynamic loader finds (as the project's binaries
//                          would), and its path; 0 and null when there is none.
// Exit status: 0 a usable device, 2 no device (or no driver), 3 the driver is older than the runtime
// needs, 1 any other CUDA error. Built by nvcc with the runtime linked statically, so that it needs
// nothing but the driver (libcuda.so.1) to start:
//   nvcc -O2 -o gpu_probe tools/gpu_probe.cpp -ldl
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <string>

namespace {

std::string json_string(const char* s) {
  std::string out = "\"";
  for (; *s != '\0'; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    }  // control and non-ASCII bytes are dropped: device names are ASCII
  }
  return out + "\"";
}

}  // namespace

int main() {
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t count_rc = cudaGetDeviceCount(&count);
  if (count_rc != cudaSuccess) count = 0;

  std::string devices = "[";
  cudaError_t rc = count_rc;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    const cudaError_t prc = cudaGetDeviceProperties(&prop, d);
    if (prc != cudaSuccess) {
      rc = prc;
      break;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "\"compute_capability\": \"%d.%d\", \"memory_bytes\": %zu", prop.major,
                  prop.minor, prop.totalGlobalMem);
    devices += std::string(d ? ", " : "") + "{\"name\": " + json_string(prop.name) + ", " + buf + "}";
  }
  devices += "]";
  // A context on device 0: the first call that really needs the driver to accept this runtime.
  if (rc == cudaSuccess && count > 0) {
    rc = cudaSetDevice(0);
    if (rc == cudaSuccess) rc = cudaFree(nullptr);
  }

  int nccl = 0;
  std::string nccl_path = "null";
  if (void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    using GetVersion = int (*)(int*);
    if (auto f = reinterpret_cast<GetVersion>(dlsym(h, "ncclGetVersion"))) f(&nccl);
    link_map* map = nullptr;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr) nccl_path = json_string(map->l_name);
  }

  std::printf(
      "{\"driver_cuda_version\": %d, \"runtime_cuda_version\": %d, \"device_count\": %d, \"error\": %s, "
      "\"devices\": %s, \"nccl_version\": %d, \"nccl_library\": %s}\n",
      driver, runtime, count, rc == cudaSuccess ? "null" : json_string(cudaGetErrorName(rc)).c_str(),
      devices.c_str(), nccl, nccl_path.c_str());
  // No driver at all also reads as cudaErrorInsufficientDriver: that is "no GPU", not "too old".
  if (driver == 0 || rc == cudaErrorNoDevice) return 2;
  if (rc == cudaErrorInsufficientDriver || driver / 1000 < runtime / 1000) return 3;
  if (count == 0) return 2;
  return rc == cudaSuccess ? 0 : 1;
}
