// The embedded workloads. Each is a small program against TraceBuilder that allocates and frees
// the way its model does, so the traces have the shapes that matter to a caching allocator (sizes,
// lifetimes, order of frees, streams) without a GPU or a framework.
//
// Determinism: only std::mt19937_64, whose output the standard fixes, and draws written here
// (Rng). The std::uniform_*_distribution templates are avoided on purpose: their algorithms are
// unspecified, so libstdc++ and libc++ would give different traces for one seed.
#include "workloads.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <random>
#include <stdexcept>
#include <utility>

namespace streampool::bench {
namespace {

constexpr std::uint64_t KiB = std::uint64_t{1} << 10;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

// Handles as the traces record them: the legacy default stream, and a side stream (a handle of
// the shape cudaStreamCreate returns).
constexpr std::uint64_t default_stream = 0x0;
constexpr std::uint64_t side_stream = 0x70e94310;

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, n), n > 0: rejection of the engine's values below 2^64 mod n, so that every
  // residue is equally likely.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t threshold = (std::numeric_limits<std::uint64_t>::max() - n + 1) % n;
    for (;;) {
      const std::uint64_t value = engine_();
      if (value >= threshold) return value % n;
    }
  }
  // Uniform in [low, high].
  std::uint64_t between(std::uint64_t low, std::uint64_t high) {
    return low + below(high - low + 1);
  }
  bool percent(std::uint64_t chance) { return below(100) < chance; }

  template <typename T>
  void shuffle(std::vector<T>& values) {  // Fisher-Yates
    for (std::size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

// Records events as an allocator would see them. Streams are given by handle and listed in order
// of first use (a free's used_on counting), as parse_trace lists them, so that a written workload
// reads back identical.
class TraceBuilder {
 public:
  using Id = std::uint64_t;

  TraceBuilder(std::string name, std::uint64_t seed) : rng_(seed) {
    trace_.name = std::move(name);
    trace_.threads = {0};
  }

  Rng& rng() { return rng_; }

  // Time passes between allocator calls: a few microseconds of host work, or a kernel's launch.
  void elapse(std::uint64_t low_us, std::uint64_t high_us) { now_us_ += rng_.between(low_us, high_us); }

  Id alloc(std::uint64_t bytes, std::uint64_t stream = default_stream) {
    elapse(1, 12);
    const Id id = trace_.allocations++;
    const std::uint32_t index = stream_index(stream);
    sizes_.push_back({bytes, index, true});
    trace_.events.push_back(
        {TraceEvent::Kind::alloc, 0, index, no_stream, id, bytes, now_us_});
    return id;
  }

  // The drop of allocation `id`; `used_on`, a stream other than its own that used it.
  void free(Id id, std::uint64_t used_on = no_handle) {
    elapse(1, 8);
    Allocation& allocation = sizes_.at(id);
    if (!allocation.live) throw std::logic_error("workload frees an allocation twice");
    allocation.live = false;
    const std::uint32_t other = used_on == no_handle ? no_stream : stream_index(used_on);
    trace_.events.push_back({TraceEvent::Kind::free, 0, allocation.stream,
                             other == allocation.stream ? no_stream : other, id, allocation.bytes,
                             now_us_});
  }

  template <typename Ids>
  void free_all(const Ids& ids) {
    for (const Id id : ids) free(id);
  }
  template <typename Ids>
  void free_all_reversed(const Ids& ids) {
    for (auto id = ids.rbegin(); id != ids.rend(); ++id) free(*id);
  }

  Trace finish() {
    trace_.left_live = static_cast<std::uint64_t>(
        std::count_if(sizes_.begin(), sizes_.end(), [](const Allocation& a) { return a.live; }));
    return std::move(trace_);
  }

  static constexpr std::uint64_t no_handle = ~std::uint64_t{0};

 private:
  struct Allocation {
    std::uint64_t bytes;
    std::uint32_t stream;
    bool live;
  };

  std::uint32_t stream_index(std::uint64_t handle) {
    const auto found = std::find(trace_.streams.begin(), trace_.streams.end(), handle);
    if (found != trace_.streams.end()) {
      return static_cast<std::uint32_t>(found - trace_.streams.begin());
    }
    trace_.streams.push_back(handle);
    return static_cast<std::uint32_t>(trace_.streams.size() - 1);
  }

  Rng rng_;
  Trace trace_;
  std::vector<Allocation> sizes_;  // by allocation number
  std::uint64_t now_us_ = 0;
};

using Ids = std::vector<TraceBuilder::Id>;

// --- transformer -------------------------------------------------------------------------------

// GPT-2 small's shape (12 layers, GPT-2's vocabulary and context) at width 384 instead of 768, and
// batch 2: the weights are 164 MB in fp32, AdamW's state twice that, and the peak of a step at
// sequence length 512 about 1.6 GB. bf16 autocast as in fine-tuning: matmul outputs and the cached
// bf16 copies of the weights are 2 bytes an element, layernorm and the residual stream 4.
struct Gpt2Shape {
  std::uint64_t layers = 12;
  std::uint64_t width = 384;
  std::uint64_t heads = 6;
  std::uint64_t vocabulary = 50257;
  std::uint64_t context = 1024;
  std::uint64_t batch = 2;
};

// The parameters of one linear layer or layernorm, and their gradients while they exist.
struct Parameter {
  std::uint64_t elements;
  TraceBuilder::Id weight;
};

class Gpt2Training {
 public:
  Gpt2Training(TraceBuilder& trace, Gpt2Shape shape) : trace_(trace), shape_(shape) {}

  // model.to("cuda"): every parameter, in module order.
  void load_weights() {
    const std::uint64_t d = shape_.width;
    wte_ = add_parameter(shape_.vocabulary * d);
    wpe_ = add_parameter(shape_.context * d);
    for (std::uint64_t layer = 0; layer < shape_.layers; ++layer) {
      Layer l;
      l.ln1_w = add_parameter(d);
      l.ln1_b = add_parameter(d);
      l.attn_w = add_parameter(d * 3 * d);
      l.attn_b = add_parameter(3 * d);
      l.proj_w = add_parameter(d * d);
      l.proj_b = add_parameter(d);
      l.ln2_w = add_parameter(d);
      l.ln2_b = add_parameter(d);
      l.fc_w = add_parameter(d * 4 * d);
      l.fc_b = add_parameter(4 * d);
      l.mlp_w = add_parameter(4 * d * d);
      l.mlp_b = add_parameter(d);
      layers_.push_back(l);
    }
    lnf_w_ = add_parameter(d);
    lnf_b_ = add_parameter(d);
  }

  void step(std::uint64_t sequence) {
    tokens_ = shape_.batch * sequence;
    sequence_ = sequence;
    const TraceBuilder::Id ids = trace_.alloc(tokens_ * 8);  // the batch, copied from the host
    const TraceBuilder::Id targets = trace_.alloc(tokens_ * 8);
    trace_.elapse(50, 400);
    forward();
    backward();
    optimizer_step();
    trace_.free_all(grads_);  // zero_grad(set_to_none=True)
    grads_.clear();
    trace_.free(loss_);
    trace_.free(logits_);  // the output the training loop held until the next batch
    trace_.free(targets);
    trace_.free(ids);
    trace_.elapse(200, 2000);
  }

  void unload() {
    trace_.free_all_reversed(optimizer_state_);
    for (auto parameter = parameters_.rbegin(); parameter != parameters_.rend(); ++parameter) {
      trace_.free(parameter->weight);
    }
  }

 private:
  struct Layer {  // indices into parameters_
    std::size_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_w,
        mlp_b;
  };
  // What a layer's forward saves for its backward, in order of allocation.
  struct Saved {
    TraceBuilder::Id input, ln1, ln1_mean, ln1_rstd, attn_w16, attn_b16, qkv, q, k, v, probs,
        merged, proj_w16, proj_b16, residual, ln2, ln2_mean, ln2_rstd, fc_w16, fc_b16, fc, gelu,
        mlp_w16, mlp_b16;
  };

  std::size_t add_parameter(std::uint64_t elements) {
    parameters_.push_back({elements, trace_.alloc(elements * 4)});
    return parameters_.size() - 1;
  }
  TraceBuilder::Id a(std::uint64_t bytes) { return trace_.alloc(bytes); }
  void f(TraceBuilder::Id id) { trace_.free(id); }
  // autocast: the bf16 copy of a parameter, cached for the forward and saved for the backward.
  TraceBuilder::Id cast16(std::size_t parameter) { return a(parameters_[parameter].elements * 2); }
  // A parameter's gradient arrives in bf16 and is accumulated into its fp32 .grad.
  void gradient(std::size_t parameter) {
    const TraceBuilder::Id grad16 = a(parameters_[parameter].elements * 2);
    grads_.push_back(a(parameters_[parameter].elements * 4));
    f(grad16);
  }
  void kernel() { trace_.elapse(5, 60); }

  void forward() {
    const std::uint64_t n = tokens_, d = shape_.width;
    const std::uint64_t attention = shape_.batch * shape_.heads * sequence_ * sequence_ * 2;
    const TraceBuilder::Id tok = a(n * d * 4);
    const TraceBuilder::Id pos = a(sequence_ * d * 4);
    TraceBuilder::Id x = a(n * d * 4);
    f(tok);
    f(pos);
    saved_.clear();
    for (const Layer& layer : layers_) {
      Saved s{};
      s.input = x;
      s.ln1 = a(n * d * 4), s.ln1_mean = a(n * 4), s.ln1_rstd = a(n * 4);
      kernel();
      s.attn_w16 = cast16(layer.attn_w), s.attn_b16 = cast16(layer.attn_b);
      s.qkv = a(n * 3 * d * 2);
      kernel();
      s.q = a(n * d * 2), s.k = a(n * d * 2), s.v = a(n * d * 2);  // heads made contiguous
      const TraceBuilder::Id scores = a(attention);
      kernel();
      const TraceBuilder::Id masked = a(attention);
      f(scores);
      s.probs = a(attention);
      f(masked);
      kernel();
      const TraceBuilder::Id heads = a(n * d * 2);
      s.merged = a(n * d * 2);
      f(heads);
      s.proj_w16 = cast16(layer.proj_w), s.proj_b16 = cast16(layer.proj_b);
      const TraceBuilder::Id projected = a(n * d * 2);
      kernel();
      s.residual = a(n * d * 4);
      f(projected);
      s.ln2 = a(n * d * 4), s.ln2_mean = a(n * 4), s.ln2_rstd = a(n * 4);
      s.fc_w16 = cast16(layer.fc_w), s.fc_b16 = cast16(layer.fc_b);
      s.fc = a(n * 4 * d * 2);
      kernel();
      s.gelu = a(n * 4 * d * 2);
      s.mlp_w16 = cast16(layer.mlp_w), s.mlp_b16 = cast16(layer.mlp_b);
      const TraceBuilder::Id mlp = a(n * d * 2);
      kernel();
      x = a(n * d * 4);
      f(mlp);
      saved_.push_back(s);
    }
    // ln_f, the tied lm_head, and cross-entropy in fp32 (autocast upcasts its input).
    final_input_ = x;
    lnf_ = a(n * d * 4), lnf_mean_ = a(n * 4), lnf_rstd_ = a(n * 4);
    wte16_ = cast16(wte_);
    logits_ = a(n * shape_.vocabulary * 2);
    kernel();
    const TraceBuilder::Id upcast = a(n * shape_.vocabulary * 4);
    log_probs_ = a(n * shape_.vocabulary * 4);
    f(upcast);
    loss_ = a(4);
    kernel();
  }

  void backward() {
    const std::uint64_t n = tokens_, d = shape_.width, v = shape_.vocabulary;
    const std::uint64_t attention = shape_.batch * shape_.heads * sequence_ * sequence_ * 2;
    const TraceBuilder::Id seed = a(4);  // d loss / d loss
    const TraceBuilder::Id d_log_probs = a(n * v * 4);
    f(seed);
    const TraceBuilder::Id d_logits32 = a(n * v * 4);
    f(d_log_probs);
    f(log_probs_);
    const TraceBuilder::Id d_logits = a(n * v * 2);
    f(d_logits32);
    kernel();
    const TraceBuilder::Id d_lnf16 = a(n * d * 2);
    gradient(wte_);
    f(d_logits);
    f(wte16_);
    const TraceBuilder::Id d_lnf = a(n * d * 4);
    f(d_lnf16);
    TraceBuilder::Id dx = a(n * d * 4);
    gradient(lnf_w_);
    gradient(lnf_b_);
    f(lnf_), f(lnf_mean_), f(lnf_rstd_), f(d_lnf);
    f(final_input_);

    for (std::size_t index = layers_.size(); index-- > 0;) {
      const Layer& layer = layers_[index];
      const Saved& s = saved_[index];
      // MLP: c_proj, gelu, c_fc, ln_2.
      const TraceBuilder::Id d_mlp = a(n * d * 2);
      const TraceBuilder::Id d_gelu = a(n * 4 * d * 2);
      gradient(layer.mlp_w), gradient(layer.mlp_b);
      f(s.mlp_w16), f(s.mlp_b16), f(d_mlp);
      kernel();
      const TraceBuilder::Id d_fc = a(n * 4 * d * 2);
      f(d_gelu), f(s.gelu), f(s.fc);
      const TraceBuilder::Id d_ln2_16 = a(n * d * 2);
      gradient(layer.fc_w), gradient(layer.fc_b);
      f(s.fc_w16), f(s.fc_b16), f(d_fc);
      const TraceBuilder::Id d_ln2 = a(n * d * 4);
      f(d_ln2_16);
      const TraceBuilder::Id d_residual_part = a(n * d * 4);
      gradient(layer.ln2_w), gradient(layer.ln2_b);
      f(s.ln2), f(s.ln2_mean), f(s.ln2_rstd), f(d_ln2);
      const TraceBuilder::Id d_residual = a(n * d * 4);
      f(d_residual_part), f(dx);
      kernel();
      // Attention: c_proj, merge heads, probs @ v, softmax, q @ k^T, split heads, c_attn, ln_1.
      const TraceBuilder::Id d_projected = a(n * d * 2);
      const TraceBuilder::Id d_merged = a(n * d * 2);
      gradient(layer.proj_w), gradient(layer.proj_b);
      f(s.proj_w16), f(s.proj_b16), f(d_projected), f(s.residual);
      const TraceBuilder::Id d_heads = a(n * d * 2);
      f(d_merged), f(s.merged);
      kernel();
      const TraceBuilder::Id d_probs = a(attention);
      const TraceBuilder::Id d_v = a(n * d * 2);
      f(d_heads), f(s.v);
      const TraceBuilder::Id d_scores = a(attention);
      f(d_probs), f(s.probs);
      kernel();
      const TraceBuilder::Id d_q = a(n * d * 2);
      const TraceBuilder::Id d_k = a(n * d * 2);
      f(d_scores), f(s.q), f(s.k);
      const TraceBuilder::Id d_qkv = a(n * 3 * d * 2);
      f(d_q), f(d_k), f(d_v), f(s.qkv);
      const TraceBuilder::Id d_ln1_16 = a(n * d * 2);
      gradient(layer.attn_w), gradient(layer.attn_b);
      f(s.attn_w16), f(s.attn_b16), f(d_qkv);
      const TraceBuilder::Id d_ln1 = a(n * d * 4);
      f(d_ln1_16);
      kernel();
      const TraceBuilder::Id d_input_part = a(n * d * 4);
      gradient(layer.ln1_w), gradient(layer.ln1_b);
      f(s.ln1), f(s.ln1_mean), f(s.ln1_rstd), f(d_ln1);
      dx = a(n * d * 4);
      f(d_input_part), f(d_residual), f(s.input);
    }
    // Embeddings: a dense gradient for wte, accumulated into the one lm_head produced; wpe's.
    const TraceBuilder::Id d_wte = a(shape_.vocabulary * d * 4);
    f(d_wte);
    const TraceBuilder::Id d_pos = a(sequence_ * d * 4);
    grads_.push_back(a(shape_.context * d * 4));
    f(d_pos);
    f(dx);
    kernel();
  }

  // AdamW, foreach implementation: the state is created at the first step and kept; each step
  // computes the denominators sqrt(exp_avg_sq) for all parameters at once, then drops them.
  void optimizer_step() {
    if (optimizer_state_.empty()) {
      for (const Parameter& parameter : parameters_) {
        optimizer_state_.push_back(a(parameter.elements * 4));  // exp_avg
        optimizer_state_.push_back(a(parameter.elements * 4));  // exp_avg_sq
      }
    }
    Ids denominators;
    for (const Parameter& parameter : parameters_) denominators.push_back(a(parameter.elements * 4));
    kernel();
    trace_.free_all(denominators);
  }

  TraceBuilder& trace_;
  Gpt2Shape shape_;
  std::vector<Parameter> parameters_;
  std::vector<Layer> layers_;
  std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  Ids optimizer_state_;
  Ids grads_;
  std::vector<Saved> saved_;
  std::uint64_t tokens_ = 0, sequence_ = 0;
  TraceBuilder::Id final_input_ = 0, lnf_ = 0, lnf_mean_ = 0, lnf_rstd_ = 0, wte16_ = 0,
                   logits_ = 0, log_probs_ = 0, loss_ = 0;
};

// --- pipeline ----------------------------------------------------------------------------------

// ResNet-18 inference in fp16 at batch 64, 224x224: the activations of each stage (input side,
// channels, output side), and the residual blocks' count per stage.
struct Stage {
  std::uint64_t side, channels, blocks;
};
constexpr std::array<Stage, 4> resnet18_stages = {{{56, 64, 2}, {28, 128, 2}, {14, 256, 2}, {7, 512, 2}}};

}  // namespace

Trace random_workload(std::uint64_t seed, std::size_t count, std::size_t max_size) {
  // RMM's random_allocations: 2 * count steps; each allocates (73 in 100) while fewer than
  // `count` allocations were made and the live bytes stay under max_usage, and otherwise frees a
  // live allocation picked at random. RMM caps the live bytes at 16000 MiB; 1 GiB here keeps the
  // trace replayable next to other work while still reaching the cap (about 500 live blocks of
  // up to 4 MiB). Whatever is left is freed at the end, in random order.
  constexpr std::uint64_t max_usage = GiB;
  if (max_size == 0) throw std::invalid_argument("random_workload: max_size must be at least 1");
  TraceBuilder trace("random", seed);
  Rng& rng = trace.rng();
  std::vector<std::pair<TraceBuilder::Id, std::uint64_t>> live;
  std::uint64_t live_bytes = 0;
  std::size_t made = 0;
  auto free_one = [&] {
    const std::size_t index = rng.below(live.size());
    std::swap(live[index], live.back());
    trace.free(live.back().first);
    live_bytes -= live.back().second;
    live.pop_back();
  };
  for (std::size_t step = 0; step < 2 * count; ++step) {
    const std::uint64_t size = rng.between(1, max_size);
    bool allocate = true;
    if (!live.empty()) {
      allocate = rng.percent(73) && made < count && live_bytes + size < max_usage;
    }
    if (allocate) {
      live.emplace_back(trace.alloc(size), size);
      live_bytes += size;
      ++made;
    } else if (!live.empty()) {
      free_one();
    }
  }
  while (!live.empty()) free_one();
  return trace.finish();
}

Trace transformer_workload(std::uint64_t seed, int steps) {
  // Sequence lengths come from buckets {512, 384, 512, 256}, each group of four steps a shuffle
  // of them (a bucketing sampler): every step's activations differ in size from the last's.
  TraceBuilder trace("transformer", seed);
  Gpt2Training training(trace, Gpt2Shape{});
  training.load_weights();
  std::vector<std::uint64_t> lengths;
  for (int step = 0; step < steps; ++step) {
    if (lengths.empty()) {
      lengths = {512, 384, 512, 256};
      trace.rng().shuffle(lengths);
    }
    training.step(lengths.back());
    lengths.pop_back();
  }
  training.unload();
  return trace.finish();
}

Trace pipeline_workload(std::uint64_t seed, int batches) {
  // Inference fed by a loader: on a side stream the producer decodes a batch (compressed bytes,
  // then uint8 pixels: its scratch, freed there) into an fp16 input tensor; the compute stream
  // runs ResNet-18 on it and frees it, so the input is allocated on the side stream and used on
  // the compute stream (record_stream). The producer runs one to three batches ahead; the last
  // batch is partial. Predictions are kept until the next batch's are ready (the host copies
  // them out), cuDNN's workspaces are scratch on the compute stream.
  constexpr std::uint64_t full_batch = 64;
  constexpr std::uint64_t image = 3 * 224 * 224;
  TraceBuilder trace("pipeline", seed);
  Rng& rng = trace.rng();

  // The model's weights and batch-norm statistics, as many small tensors as large ones.
  Ids weights;
  weights.push_back(trace.alloc(64 * 3 * 7 * 7 * 4));
  for (int norm = 0; norm < 4; ++norm) weights.push_back(trace.alloc(64 * 4));
  std::uint64_t in_channels = 64;
  for (const Stage& stage : resnet18_stages) {
    for (std::uint64_t block = 0; block < stage.blocks; ++block) {
      const std::uint64_t c = stage.channels;
      weights.push_back(trace.alloc(c * in_channels * 9 * 4));
      for (int norm = 0; norm < 4; ++norm) weights.push_back(trace.alloc(c * 4));
      weights.push_back(trace.alloc(c * c * 9 * 4));
      for (int norm = 0; norm < 4; ++norm) weights.push_back(trace.alloc(c * 4));
      if (c != in_channels) {
        weights.push_back(trace.alloc(c * in_channels * 4));
        for (int norm = 0; norm < 4; ++norm) weights.push_back(trace.alloc(c * 4));
      }
      in_channels = c;
    }
  }
  weights.push_back(trace.alloc(1000 * 512 * 4));
  weights.push_back(trace.alloc(1000 * 4));

  const auto total = static_cast<std::size_t>(std::max(batches, 0));
  const std::uint64_t last_batch = rng.between(1, full_batch);
  auto batch_size = [&](std::size_t batch) { return batch + 1 == total ? last_batch : full_batch; };
  std::vector<TraceBuilder::Id> inputs;
  auto produce = [&] {
    const std::uint64_t b = batch_size(inputs.size());
    const TraceBuilder::Id compressed = trace.alloc(b * rng.between(40, 160) * KiB, side_stream);
    const TraceBuilder::Id pixels = trace.alloc(b * image, side_stream);
    trace.free(compressed);
    trace.elapse(100, 400);
    inputs.push_back(trace.alloc(b * image * 2, side_stream));
    trace.free(pixels);
  };
  auto workspace = [&] {
    const TraceBuilder::Id scratch = trace.alloc(rng.between(1, 64) * MiB);
    trace.elapse(10, 80);
    trace.free(scratch);
  };

  TraceBuilder::Id predictions = TraceBuilder::no_handle;
  for (std::size_t batch = 0; batch < total; ++batch) {
    const std::size_t ahead = std::min<std::size_t>(total, batch + 1 + rng.below(3));
    while (inputs.size() < ahead) produce();
    const std::uint64_t b = batch_size(batch);
    // Stem: conv 7x7/2, batch norm (relu in place), max pool.
    workspace();
    const TraceBuilder::Id stem = trace.alloc(b * 64 * 112 * 112 * 2);
    const TraceBuilder::Id stem_norm = trace.alloc(b * 64 * 112 * 112 * 2);
    trace.free(stem);
    TraceBuilder::Id x = trace.alloc(b * 64 * 56 * 56 * 2);
    trace.free(stem_norm);
    trace.free(inputs[batch], default_stream);
    in_channels = 64;
    for (const Stage& stage : resnet18_stages) {
      for (std::uint64_t block = 0; block < stage.blocks; ++block) {
        const std::uint64_t bytes = b * stage.channels * stage.side * stage.side * 2;
        if (rng.percent(30)) workspace();
        const TraceBuilder::Id conv1 = trace.alloc(bytes);
        const TraceBuilder::Id norm1 = trace.alloc(bytes);
        trace.free(conv1);
        const TraceBuilder::Id conv2 = trace.alloc(bytes);
        trace.free(norm1);
        const TraceBuilder::Id norm2 = trace.alloc(bytes);
        trace.free(conv2);
        if (stage.channels != in_channels) {  // downsampled identity, added in place
          const TraceBuilder::Id down = trace.alloc(bytes);
          const TraceBuilder::Id down_norm = trace.alloc(bytes);
          trace.free(down);
          trace.free(down_norm);
        }
        trace.free(x);
        x = norm2;
        in_channels = stage.channels;
      }
    }
    const TraceBuilder::Id pooled = trace.alloc(b * 512 * 2);
    trace.free(x);
    const TraceBuilder::Id logits = trace.alloc(b * 1000 * 2);
    trace.free(pooled);
    const TraceBuilder::Id classes = trace.alloc(b * 8);
    trace.free(logits);
    if (predictions != TraceBuilder::no_handle) trace.free(predictions);
    predictions = classes;
    trace.elapse(500, 3000);
  }
  if (predictions != TraceBuilder::no_handle) trace.free(predictions);
  trace.free_all_reversed(weights);
  return trace.finish();
}

std::vector<std::string> workload_names() { return {"random", "transformer", "pipeline"}; }

Trace make_workload(const std::string& name, std::uint64_t seed) {
  if (name == "random") return random_workload(seed);
  if (name == "transformer") return transformer_workload(seed);
  if (name == "pipeline") return pipeline_workload(seed);
  throw std::invalid_argument("unknown workload '" + name + "' (random, transformer, pipeline)");
}

}  // namespace streampool::bench
