// partrain_consolidate: writes the whole model and optimizer state of a sharded checkpoint
// (ZeRO-1/2 or FSDP, any world size) into one ordinary checkpoint file, which load_checkpoint
// reads with the model and a replicated sgd or adamw. No model type and no process group needed:
// the index holds the parameters' names and shapes. (PyTorch's ZeRO must gather through rank 0
// while training to save at all.)
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

namespace {

constexpr const char* usage =
    "usage: partrain_consolidate INDEX OUT\n"
    "  INDEX  a sharded checkpoint's index (the file fit() or save_sharded_checkpoint wrote; its\n"
    "         shards, INDEX.step-S.shard-R-of-N, beside it)\n"
    "  OUT    the checkpoint file to write (atomically; replaced if it exists)\n";

// OUT must not be the index or one of its shards: writing it would destroy what it is read from.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  return std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (argc != 3) {
    std::fprintf(stderr, "partrain_consolidate: expected 2 arguments (INDEX OUT), got %d\n%s", argc - 1, usage);
    return 2;
  }
  const std::filesystem::path index = argv[1], out = argv[2];
  try {
    namespace ck = partrain::detail::zero_ckpt;
    const std::string where = "sharded checkpoint index '" + index.string() + "'";
    const auto x = ck::read_index(index, where);
    if (same_file(out, index)) {
      std::fprintf(stderr, "partrain_consolidate: OUT '%s' is the index itself; choose another file\n", out.c_str());
      return 2;
    }
    for (const auto& s : x.shards) {
      if (same_file(out, index.parent_path() / s.file)) {
        std::fprintf(stderr, "partrain_consolidate: OUT '%s' is one of the checkpoint's shards; choose another file\n",
                     out.c_str());
        return 2;
      }
    }
    partrain::consolidate_sharded_checkpoint(index, out);
    std::printf("partrain_consolidate: %s -> %s: %llu parameters, %llu %s elements, %s state, saved by %llu rank(s) at "
                "epoch %llu step %llu\n",
                index.c_str(), out.c_str(), static_cast<unsigned long long>(x.params),
                static_cast<unsigned long long>(x.total),
                std::string(partrain::to_string(static_cast<partrain::dtype>(x.type))).c_str(), x.optimizer.c_str(),
                static_cast<unsigned long long>(x.world), static_cast<unsigned long long>(x.extra.epoch),
                static_cast<unsigned long long>(x.extra.step));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "partrain_consolidate: %s\n", e.what());
    return 1;
  }
}
