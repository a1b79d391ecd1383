// export_vit_init: the example ViT's initial parameters (make_vit(vit_config{}, seed)) as raw
// little-endian float32, in make_vit's order (patch_embed: W [dim, 49], b, positions [16, dim];
// each block: LN1 gamma, beta, qkv W [3 dim, dim], b, proj W, b, LN2 gamma, beta, fc1 W, b, fc2
// W, b; head: LN gamma, beta, W [10, dim], b), and beside it FILE.shapes, one parameter's extents
// per line, so that torch_vit.py checks each tensor it maps.
//   export_vit_init FILE [--seed N]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "vit_layers.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 4 && std::string_view(argv[2]) == "--seed")) {
    std::fprintf(stderr, "usage: export_vit_init FILE [--seed N]\n");
    return 2;
  }
  const auto seed = static_cast<std::uint32_t>(argc == 4 ? std::strtoul(argv[3], nullptr, 10) : 0);
  const std::string path = argv[1];
  auto layers = models::layers::make_vit({}, seed);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::FILE* s = std::fopen((path + ".shapes").c_str(), "w");
  bool ok = f && s;
  for (auto& layer : layers) {
    for (auto& p : layer->parameters()) {
      const auto v = p.value();
      ok = ok && std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size();
      for (std::size_t d = 0; ok && d < v.shape().rank(); ++d) ok = std::fprintf(s, d ? " %zu" : "%zu", v.shape()[d]) > 0;
      ok = ok && std::fputc('\n', s) != EOF;
    }
  }
  if (f && std::fclose(f) != 0) ok = false;
  if (s && std::fclose(s) != 0) ok = false;
  if (!ok) {
    std::fprintf(stderr, "export_vit_init: cannot write %s (and .shapes)\n", path.c_str());
    return 1;
  }
  return 0;
}
