// The `tpf` command: subcommands and the small helpers they share.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace tpf::cli {

using Args = std::vector<std::string>;

int cmd_info(const Args& args);
int cmd_check(const Args& args);
int cmd_bench(const Args& args);
int cmd_accuracy(const Args& args);
int cmd_trimul_table(const Args& args);

// Median CUDA-event time of fn() over `iters` calls after `warmup` calls, in ms (bench.cpp).
double median_ms(const std::function<void()>& fn, int warmup, int iters);

bool has_flag(const Args& args, const std::string& flag);
// Value after `--name`, or `fallback`.
std::string option(const Args& args, const std::string& name, const std::string& fallback);
std::vector<int> int_list(const std::string& csv);
std::string json_escape(const std::string& s);
// Name of CUDA device 0, or "" without one.
std::string gpu_name();

}  // namespace tpf::cli
