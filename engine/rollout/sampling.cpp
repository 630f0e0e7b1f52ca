#include "engine/rollout/sampling.h"

#include <sstream>

#include "engine/errors.h"
#include "engine/kernels/decode_kernels.h"

namespace baton::engine {
namespace {

// splitmix64's increment: next() adds it to the state once per draw.
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  auto bad = [](const std::string& what) { throw EngineError("sampling: " + what); };
  if (!(temperature >= 0)) bad(detail::cat("temperature must be >= 0, got ", temperature));
  if (top_k < 0) bad(detail::cat("top_k must be >= 0 (0 = off), got ", top_k));
  if (!(top_p > 0 && top_p <= 1)) bad(detail::cat("top_p must be in (0, 1], got ", top_p));
  if (n < 1) bad(detail::cat("n must be >= 1, got ", n));
  if (max_new_tokens < 1) bad(detail::cat("max_new_tokens must be >= 1, got ", max_new_tokens));
  for (int64_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      bad(detail::cat("stop token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
}

std::string SamplingParams::to_string() const {
  std::ostringstream out;
  out << "temperature=" << temperature << " top_k=" << top_k << " top_p=" << top_p << " n=" << n
      << " max_new_tokens=" << max_new_tokens << " seed=" << seed;
  return out.str();
}

uint64_t SequenceRng::request_seed(uint64_t seed, int64_t request) {
  SequenceRng mix(seed ^ 0x6a09e667f3bcc909ULL);
  return mix.next() ^ static_cast<uint64_t>(request) * 0x9e3779b97f4a7c15ULL;
}

SequenceRng SequenceRng::for_sample(uint64_t request_seed, int64_t sample) {
  SequenceRng mix(request_seed);
  return SequenceRng(mix.next() ^ static_cast<uint64_t>(sample) * 0xbf58476d1ce4e5b9ULL);
}

uint64_t SequenceRng::next() {
  uint64_t z = (state_ += kGamma);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void SequenceRng::skip(uint64_t draws) { state_ += draws * kGamma; }  // mod 2^64, as next()

double SequenceRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

namespace {

struct Truncated {
  at::Tensor ids;    // [K] candidate token ids, most likely first (ties: lower id first)
  at::Tensor probs;  // [K] fp64: the softmax over the top-k, the top-p prefix of it; the
                     // draw scales by their sum, sampling_distribution divides by it
};

// The `k` largest of `scaled` [V] in sort(stable, descending) order: sort
// only those not below the k-th largest value (NaN, which topk ranks first,
// keeps them all), O(V + k log k) instead of a sort of the whole vocabulary.
std::tuple<at::Tensor, at::Tensor> top_k_ranked(const at::Tensor& scaled, int64_t k) {
  auto kth = std::get<0>(scaled.topk(k, 0, /*largest=*/true, /*sorted=*/false)).min();
  auto ids = scaled.lt(kth).logical_not_().nonzero().squeeze(1);  // ascending
  auto [values, order] = scaled.index_select(0, ids).sort(/*stable=*/true, 0, /*descending=*/true);
  return {values.narrow(0, 0, k), ids.index_select(0, order.narrow(0, 0, k))};
}

// The candidates after temperature, top-k and top-p. REQUIRES: temperature > 0.
// sample_on_device does the same per row of a batch: keep the two in step.
Truncated truncate(const at::Tensor& logits, const SamplingParams& p) {
  auto scaled = logits.to(at::kDouble) / p.temperature;
  int64_t v = scaled.size(0);
  at::Tensor values, ids;
  if (p.top_k > 0 && p.top_k < v) {
    std::tie(values, ids) = top_k_ranked(scaled, p.top_k);
  } else if (p.top_p < 1) {
    std::tie(values, ids) = scaled.sort(/*stable=*/true, 0, /*descending=*/true);
  } else {
    return {at::arange(v, at::kLong), at::softmax(scaled, 0)};
  }
  auto probs = at::softmax(values, 0);
  if (p.top_p < 1) {
    // Keep the smallest prefix whose mass reaches top_p: token i stays when
    // the mass before it is still below top_p (the first always stays).
    auto before = probs.cumsum(0) - probs;
    int64_t keep = std::max<int64_t>(1, before.lt(p.top_p).sum().item<int64_t>());
    ids = ids.narrow(0, 0, keep);
    probs = probs.narrow(0, 0, keep);
  }
  return {ids, probs};
}

// The draw: the first candidate whose cumulative probability c[i] exceeds
// u · c[k - 1], never one of zero probability (underflow).
int64_t walk_cdf(const double* c, int64_t k, double u) {
  u *= c[k - 1];
  int64_t pick = 0;
  while (pick < k - 1 && c[pick] <= u) ++pick;
  while (pick > 0 && c[pick] == c[pick - 1]) --pick;
  return pick;
}

void check_logits(const at::Tensor& logits) {
  ENGINE_CHECK(logits.dim() == 1 && logits.size(0) > 0, "sampling: logits must be [V], got ",
               logits.sizes());
}

}  // namespace

Sampled sample_token(const at::Tensor& logits, const SamplingParams& p, SequenceRng& rng) {
  check_logits(logits);
  // On the host: the draw walks the CDF through a raw pointer.
  auto row = logits.to(at::kCPU, at::kFloat);
  Sampled out;
  if (p.temperature == 0) {
    out.token = row.argmax().item<int64_t>();
    if (p.log_probs) out.log_prob = at::log_softmax(row, 0)[out.token].item<double>();
    return out;
  }
  auto cand = truncate(row, p);
  auto cdf = cand.probs.cumsum(0);
  auto cdf_data = cdf.contiguous();
  int64_t pick = walk_cdf(cdf_data.data_ptr<double>(), cdf_data.size(0), rng.uniform());
  out.token = cand.ids[pick].item<int64_t>();
  if (p.log_probs) out.log_prob = at::log_softmax(row / p.temperature, 0)[out.token].item<double>();
  return out;
}

std::vector<Sampled> sample_tokens(const at::Tensor& logits, const SamplingParams& p,
                                   const std::vector<SequenceRng*>& rngs) {
  if (logits.dim() != 2 || logits.size(1) == 0 ||
      logits.size(0) != static_cast<int64_t>(rngs.size()))
    throw EngineError(
        detail::cat("sampling: logits must be [B, V] with one random stream per row, got ",
                    logits.sizes(), " and ", rngs.size(), " streams"));
  auto rows = logits.to(at::kCPU, at::kFloat).contiguous();
  const int64_t b = rows.size(0), v = rows.size(1);
  std::vector<Sampled> out(b);
  if (p.temperature > 0 && ((p.top_k > 0 && p.top_k < v) || p.top_p < 1)) {
    for (int64_t i = 0; i < b; ++i) out[i] = sample_token(rows[i], p, *rngs[i]);
    return out;
  }
  // Each row's first maximum and log-sum-exp at the temperature, in one pass
  // (unused when sampling without log-probs).
  const double t = p.temperature > 0 ? p.temperature : 1.0;
  std::vector<int64_t> best(b);
  std::vector<float> lse(b);
  const float* x = rows.data_ptr<float>();
  if (p.temperature == 0 || p.log_probs)
    cpu::argmax_log_sum_exp(x, b, v, t, best.data(), lse.data());
  if (p.temperature > 0) {
    // Without truncation the candidates are the whole vocabulary in order:
    // walk each row's CDF as sample_token does.
    auto cdf = at::softmax(rows.to(at::kDouble) / p.temperature, 1).cumsum(1).contiguous();
    const double* c = cdf.data_ptr<double>();
    for (int64_t i = 0; i < b; ++i) out[i].token = walk_cdf(c + i * v, v, rngs[i]->uniform());
  } else {
    for (int64_t i = 0; i < b; ++i) out[i].token = best[i];
  }
  if (p.log_probs)  // log_softmax(x / T) at the drawn token
    for (int64_t i = 0; i < b; ++i)
      out[i].log_prob = static_cast<float>(x[i * v + out[i].token] / t) - lse[i];
  return out;
}

at::Tensor sampling_distribution(const at::Tensor& logits, const SamplingParams& p) {
  check_logits(logits);
  auto row = logits.to(at::kCPU, at::kFloat);
  auto dist = at::zeros({row.size(0)}, at::kDouble);
  if (p.temperature == 0) {
    dist[row.argmax().item<int64_t>()] = 1.0;
    return dist;
  }
  auto cand = truncate(row, p);
  return dist.index_copy_(0, cand.ids, cand.probs / cand.probs.sum());
}

namespace {

// walk_cdf for every row of `probs` [B, K] (fp64, on any device) with row
// i's uniform `uniforms[i]`, as tensor operations: the candidate position
// [B] int64. Where c = cumsum(probs) is nondecreasing along the row (a
// sequential sum: the CPU), it is walk_cdf's pick exactly; a parallel scan
// (the GPU) may round c out of order by an ulp, and the pick still has a
// probability.
at::Tensor walk_cdfs(const at::Tensor& probs, const at::Tensor& uniforms) {
  auto c = probs.cumsum(1);
  const int64_t k = c.size(1);
  auto u = uniforms.unsqueeze(1) * c.narrow(1, k - 1, 1);
  // walk_cdf's first i < k - 1 with c[i] > u, counted: the c[i] <= u before it.
  auto first = c.narrow(1, 0, k - 1).le(u).sum(1, /*keepdim=*/true);
  // Its backing off over equal c: the last candidate at or before `first`
  // that adds to c (the first candidate adds to 0), and that has a
  // probability, which adding to c implies on the CPU.
  auto c_before = at::constant_pad_nd(c.narrow(1, 0, k - 1), {1, 0}, 0);
  auto adds = c.ne(c_before).logical_and_(probs.gt(0));
  auto position = at::arange(k, c.options().dtype(at::kInt));
  return at::where(adds.logical_and_(position.le(first)), position, -1).amax(1).to(at::kLong);
}

void check_device_batch(const at::Tensor& logits, const at::Tensor& uniforms) {
  if (logits.dim() == 2 && logits.size(1) > 0 && uniforms.defined() && uniforms.dim() == 1 &&
      uniforms.size(0) == logits.size(0) && uniforms.scalar_type() == at::kDouble &&
      uniforms.device() == logits.device())
    return;
  std::ostringstream got;
  if (uniforms.defined())
    got << uniforms.sizes() << " " << uniforms.scalar_type() << " on " << uniforms.device();
  else
    got << "undefined";
  throw EngineError(detail::cat(
      "sampling on the device: logits must be [B, V] and uniforms [B] fp64 on the logits' "
      "device, got logits ",
      logits.sizes(), " on ", logits.device(), " and uniforms ", got.str()));
}

}  // namespace

DeviceSampled sample_on_device(const at::Tensor& logits, const SamplingParams& p,
                               const at::Tensor& uniforms) {
  check_device_batch(logits, uniforms);
  auto rows = logits.to(at::kFloat);
  const int64_t v = rows.size(1);
  DeviceSampled out;
  if (p.temperature == 0) {
    out.tokens = rows.argmax(1);
  } else if ((p.top_k > 0 && p.top_k < v) || p.top_p < 1) {
    // truncate, row by row: rank all tokens (a stable sort ranks ties as
    // top_k_ranked does), keep the first top_k, and give the tokens past the
    // top-p prefix probability 0, where the CDF stops rising.
    auto [values, order] =
        (rows.to(at::kDouble) / p.temperature).sort(/*stable=*/true, 1, /*descending=*/true);
    if (p.top_k > 0 && p.top_k < v) {
      values = values.narrow(1, 0, p.top_k);
      order = order.narrow(1, 0, p.top_k);
    }
    auto probs = at::softmax(values, 1);
    if (p.top_p < 1) {
      auto before = probs.cumsum(1) - probs;
      auto keep = before.lt(p.top_p).sum(1, /*keepdim=*/true).clamp_min_(1);
      probs = probs.masked_fill(at::arange(probs.size(1), keep.options()).ge(keep), 0);
    }
    out.tokens = order.gather(1, walk_cdfs(probs, uniforms).unsqueeze(1)).squeeze(1);
  } else {
    out.tokens = walk_cdfs(at::softmax(rows.to(at::kDouble) / p.temperature, 1), uniforms);
  }
  auto scaled = p.temperature > 0 ? rows / p.temperature : rows;
  out.log_probs = scaled.gather(1, out.tokens.unsqueeze(1)).squeeze(1) - at::logsumexp(scaled, {1});
  return out;
}

at::Tensor peek_uniforms(const std::vector<SequenceRng*>& rngs, int64_t steps) {
  if (steps < 0) throw EngineError(detail::cat("peek_uniforms: steps must be >= 0, got ", steps));
  const auto b = static_cast<int64_t>(rngs.size());
  auto out = at::empty({steps, b}, at::kDouble);
  double* u = out.data_ptr<double>();
  for (int64_t i = 0; i < b; ++i) {
    SequenceRng copy = *rngs[i];
    for (int64_t s = 0; s < steps; ++s) u[s * b + i] = copy.uniform();
  }
  return out;
}

}  // namespace baton::engine
