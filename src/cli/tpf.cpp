// tpf: info / check / bench for TurboPairFormer.
#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::cli {

bool has_flag(const Args& args, const std::string& flag) {
  for (const auto& a : args)
    if (a == flag) return true;
  return false;
}

std::string option(const Args& args, const std::string& name, const std::string& fallback) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return fallback;
}

std::vector<int> int_list(const std::string& csv) {
  std::vector<int> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}

std::string gpu_name() {
  if (cuda_device_count() == 0) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  return prop.name;
}

bool print_help(const Args& args, const char* usage) {
  if (!has_flag(args, "--help")) return false;
  std::puts(usage);
  return true;
}

bool require_gpu(const char* command) {
  if (cuda_device_count() > 0) return true;
  std::fprintf(stderr, "%s: no CUDA GPU found; it needs an sm_90a GPU (H100/H200). 'tpf check' runs "
                       "without one.\n", command);
  return false;
}

bool require_output_dir(const char* command, const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec) && access(dir.c_str(), W_OK) == 0) return true;
  std::fprintf(stderr, "%s: --out %s is not a writable folder (create it first)\n", command, dir.c_str());
  return false;
}

bool write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path);
  f << text;
  f.flush();
  if (f) return true;
  std::fprintf(stderr, "tpf: could not write %s\n", path.c_str());
  return false;
}

int cmd_info(const Args& args) {
  if (print_help(args, "usage: tpf info\n\nPrints the build, the GPU (if any) and the support matrix.")) return 0;
  std::printf("TurboPairFormer %s\n", version());
  std::printf("build: %s\n", build_info());
  const int n = cuda_device_count();
  if (n == 0) {
    std::printf("GPU: none found (the CUDA kernels need an sm_90a GPU: H100 or H200; the FP64 "
                "CPU reference works anywhere)\n");
  } else {
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, d);
      std::printf("GPU %d: %s, sm_%d%d, %d SMs, %.1f GiB%s\n", d, p.name, p.major, p.minor,
                  p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
                  p.major == 9 ? "" : "  (not sm_90: the kernels will not run)");
    }
  }
  std::puts(
      "\nsupport matrix\n"
      "  op                         GPU (sm_90a)                               CPU reference\n"
      "  triangle attention fwd/bwd bf16, fp16; D = 16, 32, 64, 128;            any float dtype, any D\n"
      "                             bias bf16/fp16 (= q) or fp32; bool key mask;\n"
      "                             any N >= 1, any S, strided (head-dim stride 1)\n"
      "  triangle mult. update      z bf16; weights bf16 or fp32;              fwd + bwd, outgoing/incoming\n"
      "  fwd/bwd                    C, Ch in {32, 64, 96, 128, 256}; any mask dtype;\n"
      "                             outgoing/incoming; any N >= 1 (B*Ch <= 65535)");
  return 0;
}

}  // namespace tpf::cli

int main(int argc, char** argv) {
  using namespace tpf::cli;
  const Args all(argv + 1, argv + argc);
  const std::string usage =
      "usage: tpf <command> [options]\n\n"
      "commands:\n"
      "  info    build, GPU and support matrix\n"
      "  check   accuracy and determinism against the FP64 reference (works without a GPU)\n"
      "  bench   kernel timings (needs a GPU)\n"
      "  accuracy  accuracy table against FP64 and the determinism sweep (needs a GPU)\n"
      "  trimul-table  multiplicative update: time, memory and accuracy table (needs a GPU)\n\n"
      "Run 'tpf <command> --help' for a command's options.";
  if (all.empty() || all[0] == "--help" || all[0] == "-h" || all[0] == "help") {
    std::puts(usage.c_str());
    return all.empty() ? 2 : 0;
  }
  const Args rest(all.begin() + 1, all.end());
  try {
    if (all[0] == "info") return cmd_info(rest);
    if (all[0] == "check") return cmd_check(rest);
    if (all[0] == "bench") return cmd_bench(rest);
    if (all[0] == "accuracy") return cmd_accuracy(rest);
    if (all[0] == "trimul-table") return cmd_trimul_table(rest);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpf %s: error: %s\n", all[0].c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "tpf: unknown command '%s'\n\n%s\n", all[0].c_str(), usage.c_str());
  return 2;
}
