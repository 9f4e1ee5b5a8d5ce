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

// Prints `usage` and returns true when the arguments ask for --help (the subcommand returns 0).
bool print_help(const Args& args, const char* usage);
// False, with a line on stderr naming `command`, when no CUDA GPU is present.
bool require_gpu(const char* command);
// False, with a line on stderr, unless `dir` is an existing writable folder: checked before a
// long run, so that its results are not computed and then lost.
bool require_output_dir(const char* command, const std::string& dir);
// Writes `text` to dir/name; false, with a line on stderr, when it cannot.
bool write_file(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace tpf::cli
