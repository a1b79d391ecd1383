// partrain/comm/device_mesh.hpp: the job's ranks as an N-dimensional grid with named dimensions
// (PyTorch's DeviceMesh), row-major with the last dimension innermost: with {"pp", 2}, {"dp", 2},
// {"tp", 2}, ranks 0 and 1 differ only in tp, ranks 0 and 2 only in dp. Put the dimension that
// talks most innermost (tensor parallel: consecutive ranks, one host). Every group it hands out,
// one per dimension and one per pair of dimensions flattened (e.g. dp x tp for FSDP over both),
// is made at construction through the backend's split, collectively and in one order on every
// rank, so no later call creates a group behind the others' backs.
//
//   device_mesh mesh(world, {{"dp", 2}, {"tp", 2}});
//   mesh.group("tp")          // this rank's tensor-parallel group (2 consecutive ranks)
//   mesh.coordinate("dp")     // which data-parallel replica this rank belongs to
//   distributed_data_parallel ddp(model, mesh.group("dp"));
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/subgroups.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

struct mesh_dim {
  std::string name;
  int size = 1;
};

template <std::derived_from<process_group> G>
class device_mesh {
 public:
  // Collective over `world`: every rank constructs its mesh with the same dimensions.
  device_mesh(G& world, std::vector<mesh_dim> dims) : world_(&world), dims_(std::move(dims)) {
    check();
    coords_.resize(dims_.size());
    int rest = world.rank();
    for (std::size_t i = dims_.size(); i-- > 0;) {
      coords_[i] = rest % dims_[i].size;
      rest /= dims_[i].size;
    }
    for (std::size_t i = 0; i < dims_.size(); ++i) add_group({i});
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      for (std::size_t j = i + 1; j < dims_.size(); ++j) add_group({i, j});
    }
  }

  [[nodiscard]] G& world() noexcept { return *world_; }
  [[nodiscard]] const std::vector<mesh_dim>& dims() const noexcept { return dims_; }
  [[nodiscard]] int size(std::string_view dim) const { return dims_[index(dim)].size; }
  // This rank's place along dim (0 .. size(dim) - 1).
  [[nodiscard]] int coordinate(std::string_view dim) const { return coords_[index(dim)]; }
  // The ranks that differ from this one only along dim, ranked by their coordinate there.
  [[nodiscard]] G& group(std::string_view dim) { return *find({index(dim)}); }
  // The ranks that differ from this one only along the two dimensions, row-major in mesh order.
  [[nodiscard]] G& group(std::string_view a, std::string_view b) {
    auto i = index(a), j = index(b);
    if (i == j) throw invalid_argument_error(where() + "group('" + std::string(a) + "', '" + std::string(b) + "'): the same dimension twice");
    if (i > j) std::swap(i, j);
    return *find({i, j});
  }

 private:
  struct entry {
    std::vector<std::size_t> dims;
    std::unique_ptr<G> group;
  };

  [[nodiscard]] std::string where() const { return "rank " + std::to_string(world_->rank()) + " device_mesh: "; }
  [[nodiscard]] std::string shape_text() const {
    std::string s;
    for (const auto& d : dims_) s += (s.empty() ? "" : " x ") + d.name + " " + std::to_string(d.size);
    return s.empty() ? "no dimensions" : s;
  }

  void check() const {
    if (dims_.empty()) throw invalid_argument_error(where() + "no dimensions (expected at least one, e.g. {\"dp\", 2})");
    long long product = 1;
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      if (dims_[i].name.empty()) throw invalid_argument_error(where() + "dimension " + std::to_string(i) + " has no name");
      if (dims_[i].size < 1) {
        throw invalid_argument_error(where() + "dimension '" + dims_[i].name + "' has size " + std::to_string(dims_[i].size) +
                                     " (expected >= 1)");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (dims_[j].name == dims_[i].name) {
          throw invalid_argument_error(where() + "dimension name '" + dims_[i].name + "' used twice (" + shape_text() + ")");
        }
      }
      product *= dims_[i].size;
    }
    if (product != world_->size()) {
      throw invalid_argument_error(where() + shape_text() + " is " + std::to_string(product) + " ranks, but the world has " +
                                   std::to_string(world_->size()) + " (expected the product of the sizes to be the world size)");
    }
  }

  [[nodiscard]] std::size_t index(std::string_view dim) const {
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      if (dims_[i].name == dim) return i;
    }
    throw invalid_argument_error(where() + "no dimension '" + std::string(dim) + "' in " + shape_text());
  }

  // The group of ranks that share this rank's coordinates outside `free`: the color is those
  // coordinates, row-major.
  void add_group(std::vector<std::size_t> free) {
    int color = 0;
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      const bool varies = std::find(free.begin(), free.end(), i) != free.end();
      color = color * dims_[i].size + (varies ? 0 : coords_[i]);
    }
    groups_.push_back({std::move(free), split_group(*world_, color)});
  }
  [[nodiscard]] G* find(const std::vector<std::size_t>& dims) {
    for (auto& e : groups_) {
      if (e.dims == dims) return e.group.get();
    }
    throw error(error_kind::internal, where() + "a group was not made at construction");
  }

  G* world_;
  std::vector<mesh_dim> dims_;
  std::vector<int> coords_;
  std::vector<entry> groups_;
};

}  // namespace partrain::inline v0
