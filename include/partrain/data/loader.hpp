// partrain/data/loader.hpp: the loader gathers each batch's rows into a contiguous buffer and hands
// the batches out in the sampler's order, assembling up to `prefetch` batches ahead on a
// background thread (prefetch = 0: on the caller's thread, when asked for).
//
//   in_memory_dataset ds = load_fashion_mnist(fashion_mnist_split::train);
//   loader train(ds, views::distributed(ds.size(), world, rank), {.batch_size = 64, .prefetch = 2});
//   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     train.set_epoch(epoch);                  // reaches the sampler (a no-op for unshuffled ones)
//     for (const batch& b : train) step(b);    // or: for (const batch& b : train.batches())
//   }
//
// The sampler is either a range of indices (batched here by batch_size / drop_last) or a range
// of batches (e.g. `... | views::weighted_split(w, rank)`), used as given. The loader keeps its
// own copy of the sampler (views are cheap to copy), so set the epoch through the loader.
// Each begin() starts a new epoch, stopping the previous one; a batch stays valid until the next
// increment. An exception in the dataset's fetch reaches the consumer at that batch's position.
// Stopping early (break) and destroying the loader mid-epoch stop and join the thread (never
// detach it): a dataset fetch that never returns therefore blocks them, while the consumer's own
// wait for a batch ends after loader_options::timeout with a timeout_error.
//
// The shape of the data layer, bottom up:
//   sources   views::sequential(n) | views::shuffled(n, seed) | views::distributed(n, W, r, opts)
//             random-access sized views of indices, each with set_epoch(e)
//   adaptors  | views::batched(size, drop_last)      -> batches (subranges of indices)
//             | views::weighted_split(weights, rank) -> this rank's share of every batch
//             (closures compose: auto p = views::batched(512) | views::weighted_split(w, r);)
//   loader    loader(dataset, sampler, options)     -> batch{features, labels, indices}
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <ranges>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/generator.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/batched.hpp>
#include <partrain/data/dataset.hpp>
#include <partrain/data/detail/set_epoch.hpp>

namespace partrain::inline v0 {

struct loader_options {
  std::size_t batch_size = 1;  // for a sampler of indices; ignored for a sampler of batches
  bool drop_last = false;
  std::size_t prefetch = 2;    // batches assembled ahead on a background thread; 0 = synchronous
  // Longest the consumer waits for one batch before a timeout_error (a stuck dataset fetch).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// What the consumer saw: waits are increments that found the next batch not yet ready.
struct loader_stats {
  std::size_t batches = 0;
  std::size_t waits = 0;
  std::chrono::nanoseconds wait_time{0};
};

namespace detail::data {

template <class R>
concept batch_range = std::ranges::input_range<const R> &&
                      std::ranges::input_range<std::ranges::range_reference_t<const R>> &&
                      std::integral<std::remove_cvref_t<
                          std::ranges::range_reference_t<std::ranges::range_reference_t<const R>>>>;

template <class S>
struct batches {
  using type = S;
  static S make(S s, const loader_options&) { return s; }
};
template <class S>
  requires index_range<S>
struct batches<S> {
  using type = batched_view<S>;
  static type make(S s, const loader_options& o) { return type(std::move(s), o.batch_size, o.drop_last); }
};

// One batch buffer; the loader cycles through prefetch + 1 of them.
struct slot {
  host_buffer<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::size_t> indices;
  std::size_t capacity = 0;  // rows the buffers hold
  batch view;
};

// One pass over the batches. Owns the background thread (declared last, so it is stopped and
// joined before the buffers it writes are destroyed).
template <class D, class B>
class epoch {
 public:
  epoch(const D& ds, B batches, const loader_options& options)
      : dataset_(&ds), batches_(std::move(batches)), options_(options), slots_(options.prefetch + 1),
        example_shape_(ds.example_shape()) {
    if (example_shape_.rank() + 1 > max_rank) {
      throw invalid_argument_error("loader: examples of shape " + example_shape_.to_string() + " have " +
                                   std::to_string(example_shape_.rank()) + " dimensions, expected at most " +
                                   std::to_string(max_rank - 1));
    }
    it_ = std::ranges::begin(batches_);
    if (options_.prefetch > 0) {
      worker_ = std::jthread([this](std::stop_token stop) { produce(stop); });
    }
  }
  epoch(const epoch&) = delete;
  epoch& operator=(const epoch&) = delete;

  // The next batch, or nullptr at the end of the epoch. Releases the previous batch's buffer.
  const batch* next(loader_stats& stats) {
    if (options_.prefetch == 0) {
      if (it_ == std::ranges::end(batches_)) return nullptr;
      slot& s = slots_[0];
      fill(s, *it_);
      ++it_;
      ++stats.batches;
      return &s.view;
    }
    std::unique_lock lock(mutex_);
    if (holding_) {
      ++released_;
      holding_ = false;
      cv_.notify_all();
    }
    const auto ready = [&] { return produced_ > released_ || finished_; };
    if (!ready()) {
      ++stats.waits;
      const auto t0 = std::chrono::steady_clock::now();
      if (!cv_.wait_for(lock, options_.timeout, ready)) {
        throw timeout_error("loader: batch " + std::to_string(released_) + " was not ready within " +
                            std::to_string(options_.timeout.count()) + " ms (is the dataset's fetch stuck?)");
      }
      stats.wait_time += std::chrono::steady_clock::now() - t0;
    }
    if (produced_ == released_) {
      // Finished: the producer's error, if any, comes after every batch it published.
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      return nullptr;
    }
    slot& s = slots_[released_ % slots_.size()];
    holding_ = true;
    ++stats.batches;
    return &s.view;
  }

 private:
  template <class Indices>
  void fill(slot& s, Indices&& indices) {
    s.indices.clear();
    for (auto&& i : indices) s.indices.push_back(static_cast<std::size_t>(i));
    const std::size_t n = s.indices.size();
    const std::size_t row = example_shape_.numel();
    if (n > s.capacity) {
      // Room for a whole batch at once, but never more rows than the data set has (a batch_size
      // of a billion is a request for the whole set, not for gigabytes).
      const std::size_t rows = std::max(n, std::min(options_.batch_size, dataset_->size()));
      s.features = host_buffer<float>(rows * row);
      s.labels.assign(rows, 0);
      s.capacity = rows;
    }
    std::size_t dims[max_rank]{n};
    for (std::size_t d = 0; d < example_shape_.rank(); ++d) dims[d + 1] = example_shape_[d];
    const shape batch_shape(std::span<const std::size_t>(dims, example_shape_.rank() + 1));
    tensor_view<float> features(s.features.data(), batch_shape);
    tensor_view<std::int32_t> labels(s.labels.data(), n);
    dataset_->fetch(std::span<const std::size_t>(s.indices), features, labels);
    s.view = batch{features, labels, std::span<const std::size_t>(s.indices)};
  }

  void produce(std::stop_token stop) {
    std::exception_ptr failure;
    try {
      for (std::size_t k = 0; it_ != std::ranges::end(batches_); ++k) {
        {
          std::unique_lock lock(mutex_);
          // Wait for the slot that batch k goes into to be released by the consumer.
          if (!cv_.wait(lock, stop, [&] { return k < released_ + slots_.size(); })) return;
        }
        fill(slots_[k % slots_.size()], *it_);  // outside the lock: the slot is ours until published
        ++it_;
        // The last batch is published together with the end, so a consumer that reaches the end
        // does not wait for a second wake-up.
        const bool last = it_ == std::ranges::end(batches_);
        std::lock_guard lock(mutex_);
        ++produced_;
        finished_ = last;
        cv_.notify_all();
      }
    } catch (...) {
      failure = std::current_exception();
    }
    // Published only after the handler has ended, so this thread holds no other reference to the
    // exception object: the consumer's thread is the one that frees it.
    std::lock_guard lock(mutex_);
    error_ = std::move(failure);
    finished_ = true;
    cv_.notify_all();
  }

  const D* dataset_;
  B batches_;
  loader_options options_;
  std::vector<slot> slots_;
  shape example_shape_;
  std::ranges::iterator_t<B> it_{};
  std::mutex mutex_;
  std::condition_variable_any cv_;
  std::size_t produced_ = 0;  // batches published by the producer
  std::size_t released_ = 0;  // batches the consumer is done with
  bool holding_ = false;      // the consumer holds batch `released_`
  bool finished_ = false;     // the producer will publish nothing more
  std::exception_ptr error_;  // why the producer stopped early
  std::jthread worker_;
};

}  // namespace detail::data

template <class D, std::ranges::view S>
  requires(check_dataset<D>() && (index_range<S> || detail::data::batch_range<S>))
class loader {
  // Each epoch iterates its own copy of the sampler, so set_epoch during an epoch is safe; a
  // move-only sampler (an owned std::vector) is referenced instead.
  using epoch_sampler = std::conditional_t<std::copyable<S>, S, std::ranges::ref_view<const S>>;
  using batches_type = typename detail::data::batches<epoch_sampler>::type;
  using epoch_type = detail::data::epoch<D, batches_type>;

  [[nodiscard]] batches_type make_batches() const {
    if constexpr (std::copyable<S>) {
      return detail::data::batches<epoch_sampler>::make(sampler_, options_);
    } else {
      return detail::data::batches<epoch_sampler>::make(std::ranges::ref_view<const S>(sampler_), options_);
    }
  }

 public:
  class iterator;
  struct sentinel {};

  loader(const D& dataset, S sampler, loader_options options = {})
      : dataset_(&dataset), sampler_(std::move(sampler)), options_(options) {
    if (options_.batch_size == 0) throw invalid_argument_error("loader: batch_size is 0, expected at least 1");
    if (options_.timeout <= std::chrono::milliseconds::zero()) {
      throw invalid_argument_error("loader: timeout must be positive");
    }
  }
  // The loader keeps a pointer to the dataset: a temporary would dangle.
  loader(const D&& dataset, S sampler, loader_options options = {}) = delete;
  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;

  // Starts an epoch (stopping the one before, whose batches become invalid).
  [[nodiscard]] iterator begin() {
    stop();
    epoch_ = std::make_unique<epoch_type>(*dataset_, make_batches(), options_);
    iterator it(this);
    it.advance();
    return it;
  }
  [[nodiscard]] sentinel end() const noexcept { return {}; }

  // The same epoch as a coroutine: for (const batch& b : loader.batches()).
  [[nodiscard]] generator<const batch&> batches() {
    for (auto it = begin(); it != end(); ++it) co_yield *it;
  }

  // Forwards to the sampler (e.g. distributed_view::set_epoch); false if it has none.
  bool set_epoch(std::uint64_t epoch) { return detail::data::forward_set_epoch(sampler_, epoch); }

  // Stops the running epoch now and joins its thread (also done by begin() and the destructor).
  void stop() noexcept { epoch_.reset(); }

  // Batches per epoch, when the sampler knows its size.
  [[nodiscard]] std::size_t size() const
    requires std::ranges::sized_range<const batches_type>
  {
    return static_cast<std::size_t>(std::ranges::size(make_batches()));
  }
  [[nodiscard]] const S& sampler() const noexcept { return sampler_; }
  [[nodiscard]] const loader_options& options() const noexcept { return options_; }
  [[nodiscard]] const loader_stats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

  class iterator {
   public:
    using value_type = batch;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    [[nodiscard]] const batch& operator*() const noexcept { return *current_; }
    [[nodiscard]] const batch* operator->() const noexcept { return current_; }
    iterator& operator++() {
      advance();
      return *this;
    }
    void operator++(int) { advance(); }
    [[nodiscard]] friend bool operator==(const iterator& it, sentinel) noexcept { return it.current_ == nullptr; }

   private:
    friend class loader;
    explicit iterator(loader* owner) noexcept : owner_(owner) {}
    void advance() {
      current_ = nullptr;
      current_ = owner_->epoch_->next(owner_->stats_);
    }
    loader* owner_ = nullptr;
    const batch* current_ = nullptr;
  };

 private:
  const D* dataset_;
  S sampler_;
  loader_options options_;
  loader_stats stats_{};
  std::unique_ptr<epoch_type> epoch_;  // last: destroyed (thread joined) first
};

template <class D, class R>
loader(const D&, R&&) -> loader<D, std::views::all_t<R>>;
template <class D, class R>
loader(const D&, R&&, loader_options) -> loader<D, std::views::all_t<R>>;

}  // namespace partrain::inline v0
