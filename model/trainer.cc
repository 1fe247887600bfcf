#include "model/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/longnet_params.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// Streams derived from config.seed (trainer.h).
constexpr uint64_t kSamplerStream = 1;
constexpr uint64_t kEvalRetrievalStream = 2;
constexpr uint64_t kRngStream = 3;
constexpr uint64_t kTrainRetrievalStream = 4;

#define TRAINER_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const ::absl::Status trainer_status_ = (expr);     \
    if (!trainer_status_.ok()) return trainer_status_; \
  } while (0)

absl::Status WithPrefix(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Every leaf of a JSON document as "a.b[2]" -> its text.
void Flatten(const Json& j, const std::string& path, std::map<std::string, std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      Flatten(it.value(), path.empty() ? it.key() : absl::StrCat(path, ".", it.key()), out);
    }
  } else if (j.is_array() && !j.empty() && (j[0].is_object() || j[0].is_array())) {
    for (size_t i = 0; i < j.size(); ++i) Flatten(j[i], absl::StrCat(path, "[", i, "]"), out);
  } else {
    (*out)[path] = j.dump();
  }
}

// "field: <a's value> there, <b's value> here" for each leaf that differs.
std::vector<std::string> Differences(const Json& there, const Json& here) {
  std::map<std::string, std::string> a, b;
  Flatten(there, "", &a);
  Flatten(here, "", &b);
  std::vector<std::string> out;
  for (const auto& [path, value] : a) {
    auto it = b.find(path);
    const std::string other = it == b.end() ? "(absent)" : it->second;
    if (other != value) out.push_back(absl::StrCat(path, ": ", value, " there, ", other, " here"));
  }
  for (const auto& [path, value] : b) {
    if (a.count(path) == 0) out.push_back(absl::StrCat(path, ": (absent) there, ", value, " here"));
  }
  return out;
}

Json FiniteOrNull(double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); }

double NumberOrNan(const Json& j) {
  return j.is_number() ? j.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

int64_t CountScored(const std::vector<int32_t>& targets, size_t begin, size_t end) {
  int64_t n = 0;
  for (size_t i = begin; i < end; ++i) n += targets[i] != kIgnoreTarget;
  return n;
}

// Sum of a gathered vector's entries i, i + k, i + 2k, ... (rank order).
double SumStrided(const std::vector<double>& values, size_t i, size_t k) {
  double sum = 0;
  for (size_t j = i; j < values.size(); j += k) sum += values[j];
  return sum;
}

}  // namespace

absl::StatusOr<TokenCorpus> OpenTrainingCorpus(const TrainerConfig& config, CorpusReport* report) {
  if (config.data.paths.empty()) {
    return absl::InvalidArgumentError(
        "trainer config field \"data.paths\": [] names no text file, folder or token file");
  }
  if (config.data.format == "tokens") return TokenCorpus::FromTokenFiles(config.data.paths);
  return TokenCorpus::FromText(config.data.paths[0], {}, report);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& config,
                                                         TokenCorpus corpus,
                                                         std::unique_ptr<TrainableModel> model,
                                                         const TrainerOptions& options) {
  TRAINER_RETURN_IF_ERROR(ValidateTrainerConfig(config));
  if (model == nullptr) return absl::InvalidArgumentError("Trainer: no model");
  if (model->config() != config.model) {
    return absl::InvalidArgumentError(
        "Trainer: the model was made for another config than trainer config field \"model\"");
  }
  if (model->checkpoint_activations() != config.checkpoint_activations) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Trainer: the model was made with activation checkpointing ",
        model->checkpoint_activations() ? "on" : "off",
        ", trainer config field \"checkpoint_activations\" is ", config.checkpoint_activations));
  }
  if (corpus.vocab_size() > config.model.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer config field \"model.vocab_size\": ", config.model.vocab_size,
                     " is smaller than the corpus's vocabulary of ", corpus.vocab_size()));
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->options_ = options;
  if (options.collective != nullptr) {
    t->collective_ = options.collective;
  } else {
    t->own_collective_ = NewSingleProcessCollective();
    t->collective_ = t->own_collective_.get();
  }
  const int world = t->collective_->world();
  const int rank = t->collective_->rank();
  const int sp = options.sequence_parallel;
  if (sp < 1 || world % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainerOptions::sequence_parallel: ", sp,
                     " must be >= 1 and divide the collective's world of ", world, " ranks"));
  }
  const int dp = world / sp;
  t->data_parallel_ = dp;
  t->sequence_parallel_ = sp;
  t->overlap_reduction_ =
      options.overlap_gradient_reduction && sp == 1 && t->collective_->reduces_ranges_early();
  t->data_rank_ = rank / sp;
  t->sequence_rank_ = rank % sp;
  if (absl::Status s = CheckParallelDegrees(config, dp, sp); !s.ok()) return s;
  t->micro_rows_ = config.batch_size / config.micro_batches / dp;
  const int64_t n = config.seq_len;

  // Data: the split, the training sampler, the validation windows, the retrieval tasks.
  absl::StatusOr<DataSplit> split =
      SplitTrainValidation(corpus.size(), config.data.validation_fraction, n + 1);
  if (!split.ok()) {
    return WithPrefix(split.status(),
                      absl::StrCat("trainer data (", corpus.size(), " tokens, seq_len ", n, "): "));
  }
  t->split_ = *split;
  absl::StatusOr<WindowSampler> train = WindowSampler::Create(
      corpus, split->train, {n, config.batch_size, HashPair(config.seed, kSamplerStream), true});
  if (!train.ok()) return WithPrefix(train.status(), "training sampler: ");
  t->train_sampler_ = *std::move(train);
  if (split->validation.size() > 0) {
    const int64_t windows = (split->validation.size() - 1) / n;
    int64_t rows = t->micro_rows_ * dp;
    if (windows < rows) rows = windows / dp * dp;
    if (rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer config field \"data.validation_fraction\": ", config.data.validation_fraction,
          " holds out ", split->validation.size(), " tokens: ", windows, " windows of seq_len ", n,
          " + 1, fewer than the ", dp, " data-parallel ranks"));
    }
    absl::StatusOr<WindowSampler> validation =
        WindowSampler::Create(corpus, split->validation, {n, rows, 0, false});
    if (!validation.ok()) return WithPrefix(validation.status(), "validation sampler: ");
    t->validation_sampler_ = *std::move(validation);
    t->validation_start_ = t->validation_sampler_->cursor();
    t->validation_rows_ = rows;
    t->validation_batches_ = std::min(config.eval.batches, windows / rows);
  }
  const TrainerConfig::Retrieval& r = config.retrieval;
  if (r.examples > 0) {
    RetrievalOptions o;
    o.seq_len = config.retrieval_seq_len();
    o.depth = r.depth;
    o.key_length = r.key_length;
    o.value_length = r.value_length;
    o.distractors = r.distractors;
    o.score_text = false;
    o.seed = HashPair(config.seed, kEvalRetrievalStream);
    absl::StatusOr<RetrievalTask> task = RetrievalTask::Create(corpus, split->validation, o);
    if (!task.ok()) {
      return WithPrefix(task.status(),
                        "trainer config field \"retrieval\": the evaluation task on the held-out "
                        "split: ");
    }
    t->eval_task_ = *std::move(task);
  }
  if (r.train_fraction > 0) {
    RetrievalOptions o;
    o.seq_len = n;
    o.depth = -1;
    o.key_length = r.key_length;
    o.value_length = r.value_length;
    o.distractors = r.distractors;
    o.score_text = true;
    o.seed = HashPair(config.seed, kTrainRetrievalStream);
    absl::StatusOr<RetrievalTask> task = RetrievalTask::Create(corpus, split->train, o);
    if (!task.ok()) {
      return WithPrefix(task.status(),
                        "trainer config field \"retrieval.train_fraction\": the training task: ");
    }
    t->train_task_ = *std::move(task);
  }

  // The optimizer over this rank's shard.
  t->model_ = std::move(model);
  const ParamLayout& layout = t->model_->layout();
  absl::StatusOr<AdamW> adamw =
      AdamW::Create(layout, config.adamw(),
                    config.optimizer.decay_embeddings ? DecayPredicate(WantsWeightDecay)
                                                      : DecayPredicate(DecayByConvention));
  if (!adamw.ok()) return WithPrefix(adamw.status(), "trainer config field \"optimizer\": ");
  t->adamw_ = *std::move(adamw);
  if (layout.total() < world) {
    return absl::InvalidArgumentError(
        absl::StrCat(layout.total(), " parameters cannot be sharded over ", world, " ranks"));
  }
  t->shards_ = ShardRanges(layout.total(), world);
  const ShardRange mine = t->shards_[static_cast<size_t>(rank)];
  absl::StatusOr<std::unique_ptr<ShardOptimizer>> optimizer =
      t->model_->NewOptimizer(*t->adamw_, mine.begin, mine.end);
  if (!optimizer.ok()) return optimizer.status();
  t->optimizer_ = *std::move(optimizer);

  t->rng_ = Rng(HashPair(config.seed, kRngStream));
  t->corpus_ = std::move(corpus);
  TRAINER_RETURN_IF_ERROR(t->model_->InitParams(config.seed));
  return t;
}

double Trainer::flops_per_step() const {
  return static_cast<double>(config_.micro_batches) *
         model_->TrainingFlops(micro_rows_, config_.seq_len) / sequence_parallel_;
}

TokenBatch Trainer::SliceRows(const Batch& batch, int64_t first_row, int64_t rows, int64_t n,
                              std::vector<int32_t>* tokens, std::vector<int32_t>* targets) const {
  const int64_t len = n / sequence_parallel_;
  const int64_t begin = sequence_rank_ * len;
  tokens->resize(static_cast<size_t>(rows * len));
  targets->resize(static_cast<size_t>(rows * len));
  for (int64_t r = 0; r < rows; ++r) {
    const size_t from = static_cast<size_t>((first_row + r) * n + begin);
    std::copy_n(batch.inputs.begin() + from, len, tokens->begin() + r * len);
    std::copy_n(batch.targets.begin() + from, len, targets->begin() + r * len);
  }
  TokenBatch tb;
  tb.tokens = tokens->data();
  tb.targets = targets->data();
  tb.batch = rows;
  tb.seq_len = len;
  // One sequence rank holds the whole rows: positions stay the default (offset 0, the whole).
  if (sequence_parallel_ > 1) tb.positions = {begin, n};
  return tb;
}

absl::Status Trainer::AgreeOnStatus(const absl::Status& mine) {
  if (collective_->world() == 1) return mine;
  std::string message;
  if (!mine.ok()) {
    message = absl::StrCat(static_cast<int>(mine.code()), ":", mine.message());
  }
  absl::StatusOr<std::vector<std::string>> all = collective_->AllGatherBytes(message);
  if (!all.ok()) return mine.ok() ? all.status() : mine;
  if (!mine.ok()) return mine;
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& m = (*all)[r];
    if (m.empty()) continue;
    const size_t colon = m.find(':');
    int code = static_cast<int>(absl::StatusCode::kUnknown);
    if (colon == std::string::npos || !absl::SimpleAtoi(m.substr(0, colon), &code)) {
      return absl::UnknownError(absl::StrCat("rank ", r, ": ", m));
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("rank ", r, ": ", m.substr(colon + 1)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Trainer::RanksAskingToStop(bool mine) {
  std::vector<int> asking;
  if (collective_->world() == 1) {
    if (mine) asking.push_back(0);
    return asking;
  }
  absl::StatusOr<std::vector<double>> flags = collective_->AllGather({mine ? 1.0 : 0.0});
  if (!flags.ok()) return flags.status();
  for (size_t r = 0; r < flags->size(); ++r) {
    if ((*flags)[r] != 0) asking.push_back(static_cast<int>(r));
  }
  return asking;
}

absl::Status Trainer::MixRetrieval(Batch* batch, int64_t* replaced) {
  *replaced = 0;
  if (!train_task_.has_value()) return absl::OkStatus();
  const int64_t n = config_.seq_len;
  // Every rank draws for every row of the global batch, so the ranks' Rngs stay equal.
  for (int64_t row = 0; row < config_.batch_size; ++row) {
    if (!(rng_.Uniform() < config_.retrieval.train_fraction)) continue;
    const int64_t index = static_cast<int64_t>(rng_.Next() >> 1);
    ++*replaced;
    const int64_t local = row - batch->first_row;
    if (local < 0 || local >= batch->rows) continue;
    Batch example;
    TRAINER_RETURN_IF_ERROR(train_task_->MakeBatch(index, 1, &example));
    std::copy(example.inputs.begin(), example.inputs.end(), batch->inputs.begin() + local * n);
    std::copy(example.targets.begin(), example.targets.end(), batch->targets.begin() + local * n);
    batch->starts[static_cast<size_t>(local)] = example.starts[0];
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = config_.seq_len;
  StepResult result;
  result.step = step_ + 1;

  Batch batch;
  TRAINER_RETURN_IF_ERROR(train_sampler_->Next(&batch, data_rank_, data_parallel_));
  TRAINER_RETURN_IF_ERROR(MixRetrieval(&batch, &result.retrieval_rows));

  // This rank's slices of the micro-batches, and the global batch's scored targets: each
  // micro-batch's share of the mean.
  const size_t micros = static_cast<size_t>(config_.micro_batches);
  std::vector<std::vector<int32_t>> tokens(micros), targets(micros);
  std::vector<TokenBatch> slices(micros);
  std::vector<int64_t> micro_targets(micros);
  int64_t local_targets = 0;
  for (size_t i = 0; i < micros; ++i) {
    slices[i] = SliceRows(batch, static_cast<int64_t>(i) * micro_rows_, micro_rows_, n, &tokens[i],
                          &targets[i]);
    micro_targets[i] = CountScored(targets[i], 0, targets[i].size());
    local_targets += micro_targets[i];
  }
  absl::StatusOr<std::vector<double>> counts =
      collective_->AllGather({static_cast<double>(local_targets)});
  if (!counts.ok()) return counts.status();
  const int64_t global_targets = std::llround(SumStrided(*counts, 0, 1));
  if (global_targets < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", result.step, ": the global batch has no scored target"));
  }

  // Forward and backward, micro-batch by micro-batch, accumulating into grads(). The last
  // micro-batch's backward hands each finished range to the reduction (TrainerOptions::
  // overlap_gradient_reduction), which the collective may start at once.
  const int64_t total = model_->layout().total();
  double loss_sum = 0;
  for (size_t i = 0; i < micros; ++i) {
    BackwardOptions bo;
    bo.loss_scale = static_cast<double>(micro_targets[i]) / static_cast<double>(global_targets);
    bo.grads = i == 0 ? Accumulate::kOverwrite : Accumulate::kAdd;
    if (i + 1 == micros) {
      TRAINER_RETURN_IF_ERROR(collective_->BeginGradientReduction(model_->grads(), total,
                                                                  absl::MakeConstSpan(shards_)));
      if (overlap_reduction_) {
        bo.on_grads_final = [this](int64_t begin, int64_t end) {
          return collective_->GradientsFinal(begin, end);
        };
      }
    }
    absl::StatusOr<LossResult> loss = model_->ForwardBackward(slices[i], bo);
    if (!loss.ok()) return WithPrefix(loss.status(), absl::StrCat("step ", result.step, ": "));
    loss_sum += loss->loss_sum;
  }

  // Reduce (what the backward did not start), clip by the global norm, update this rank's shard,
  // share the parameters.
  TRAINER_RETURN_IF_ERROR(collective_->FinishGradientReduction());
  absl::StatusOr<double> partial = optimizer_->GradSumOfSquares();
  if (!partial.ok()) return partial.status();
  absl::StatusOr<std::vector<double>> partials = collective_->AllGather({*partial});
  if (!partials.ok()) return partials.status();
  result.grad_norm = GlobalNorm(*partials);
  absl::StatusOr<double> scale = ClipScale(result.grad_norm, config_.optimizer.max_grad_norm);
  if (scale.ok()) {
    result.clip_scale = *scale;
    result.lr = config_.schedule().At(step_ + 1);
    AdamWStepArgs args;
    args.t = updates_ + 1;
    args.lr = result.lr;
    args.grad_scale = *scale;
    TRAINER_RETURN_IF_ERROR(optimizer_->Update(args));
    ++updates_;
    consecutive_skips_ = 0;
    TRAINER_RETURN_IF_ERROR(
        collective_->AllGatherParameters(model_->params(), total, absl::MakeConstSpan(shards_)));
  } else if (scale.status().code() == absl::StatusCode::kOutOfRange) {
    result.skipped = true;
    result.clip_scale = 0;
    ++consecutive_skips_;
  } else {
    return scale.status();
  }

  absl::StatusOr<std::vector<double>> sums = collective_->AllGather({loss_sum});
  if (!sums.ok()) return sums.status();
  result.loss = SumStrided(*sums, 0, 1) / static_cast<double>(global_targets);
  result.targets = global_targets;
  result.tokens = config_.batch_size * n;
  result.flops = flops_per_step();
  ++step_;
  tokens_seen_ += result.tokens;
  history_.train.push_back({step_, result.loss});
  result.seconds = Seconds(start);
  if (result.skipped && consecutive_skips_ >= config_.optimizer.max_consecutive_skips) {
    return absl::AbortedError(
        absl::StrCat("training diverged: the gradient norm was not finite (", result.grad_norm,
                     ") at ", consecutive_skips_, " steps in a row, the last at step ", step_,
                     " (trainer config field \"optimizer.max_consecutive_skips\" = ",
                     config_.optimizer.max_consecutive_skips,
                     "); lower optimizer.lr or resume from an "
                     "earlier checkpoint"));
  }
  return result;
}

absl::StatusOr<EvalResult> Trainer::EvaluateNow() {
  const auto start = std::chrono::steady_clock::now();
  EvalResult result;
  result.step = step_;
  // Validation loss: the same windows every time; each rank evaluates its data-parallel rank's
  // rows and its sequence rank's positions of them.
  double loss_sum = 0;
  int64_t targets = 0;
  std::vector<int32_t> tokens, scored;
  if (validation_sampler_.has_value()) {
    TRAINER_RETURN_IF_ERROR(validation_sampler_->Restore(validation_start_));
    for (int64_t b = 0; b < validation_batches_; ++b) {
      Batch vb;
      TRAINER_RETURN_IF_ERROR(validation_sampler_->Next(&vb, data_rank_, data_parallel_));
      const TokenBatch tb = SliceRows(vb, 0, vb.rows, vb.seq_len, &tokens, &scored);
      absl::StatusOr<LossResult> loss = model_->Evaluate(tb, {});
      if (!loss.ok()) return WithPrefix(loss.status(), "validation: ");
      loss_sum += loss->loss_sum;
      targets += loss->num_targets;
    }
  }
  // Retrieval: examples [0, examples) of the held-out task, in global batches of the training
  // micro-batch's rows; each data-parallel rank takes its part of each batch, each sequence rank
  // its positions of those rows. The answer's positions may lie on several sequence ranks, so
  // each rank marks which of the batch's answer tokens it holds and got right, the marks are
  // all-gathered (each token is held by exactly one rank) and every rank scores the whole batch.
  RetrievalScore score;
  if (eval_task_.has_value()) {
    const int64_t examples = config_.retrieval.examples;
    const int64_t rows = micro_rows_ * data_parallel_;
    const int64_t n = eval_task_->options().seq_len;
    const int64_t answer = eval_task_->options().value_length;
    const int64_t len = n / sequence_parallel_;
    const int64_t begin = sequence_rank_ * len;
    for (int64_t first = 0; first < examples; first += rows) {
      const int64_t count = std::min(rows, examples - first);
      const int64_t mine = first + data_rank_ * count / data_parallel_;
      const int64_t mine_end = first + (data_rank_ + 1) * count / data_parallel_;
      std::vector<double> right(static_cast<size_t>(count * answer), 0.0);
      if (mine_end > mine) {
        Batch rb;
        TRAINER_RETURN_IF_ERROR(eval_task_->MakeBatch(mine, mine_end - mine, &rb));
        const TokenBatch tb = SliceRows(rb, 0, rb.rows, n, &tokens, &scored);
        std::vector<int32_t> predictions(static_cast<size_t>(rb.rows * len));
        absl::StatusOr<LossResult> loss = model_->Evaluate(tb, absl::MakeSpan(predictions));
        if (!loss.ok()) return WithPrefix(loss.status(), "retrieval evaluation: ");
        // The answer is the last `answer` targets of each row (retrieval.h's Score).
        for (int64_t r = 0; r < rb.rows; ++r) {
          for (int64_t i = std::max(n - answer, begin); i < begin + len; ++i) {
            const bool ok = predictions[static_cast<size_t>(r * len + i - begin)] ==
                            rb.targets[static_cast<size_t>(r * n + i)];
            right[static_cast<size_t>((mine - first + r) * answer + i - (n - answer))] = ok;
          }
        }
      }
      absl::StatusOr<std::vector<double>> all = collective_->AllGather(right);
      if (!all.ok()) return all.status();
      for (int64_t e = 0; e < count; ++e) {
        int64_t correct = 0;
        for (int64_t j = 0; j < answer; ++j) {
          correct += std::llround(SumStrided(*all, static_cast<size_t>(e * answer + j),
                                             static_cast<size_t>(count * answer)));
        }
        score.correct_tokens += correct;
        score.exact += correct == answer;
      }
      score.examples += count;
      score.answer_tokens += count * answer;
    }
  }
  absl::StatusOr<std::vector<double>> gathered =
      collective_->AllGather({loss_sum, static_cast<double>(targets)});
  if (!gathered.ok()) return gathered.status();
  constexpr size_t k = 2;
  if (validation_sampler_.has_value()) {
    result.has_loss = true;
    result.targets = std::llround(SumStrided(*gathered, 1, k));
    result.loss = result.targets > 0
                      ? SumStrided(*gathered, 0, k) / static_cast<double>(result.targets)
                      : 0.0;
    if (config_.byte_level()) result.bits_per_byte = result.loss / std::log(2.0);
  }
  if (eval_task_.has_value()) {
    result.has_retrieval = true;
    result.retrieval_depth = config_.retrieval.depth;
    result.retrieval_seq_len = eval_task_->options().seq_len;
    result.retrieval = score;
  }
  result.seconds = Seconds(start);
  return result;
}

absl::StatusOr<EvalResult> Trainer::Evaluate() {
  absl::StatusOr<EvalResult> result = EvaluateNow();
  if (result.ok()) history_.evals.push_back(*result);
  return result;
}

std::string Trainer::ExtraJson() const {
  Json extra;
  extra["trainer_config"] = Json::parse(TrainerConfigToJson(config_));
  extra["consecutive_skips"] = consecutive_skips_;
  Json train = Json::array();
  for (const TrainingHistory::Point& p : history_.train) {
    train.push_back(Json::array({p.step, FiniteOrNull(p.loss)}));
  }
  Json evals = Json::array();
  for (const EvalResult& e : history_.evals) {
    Json j;
    j["step"] = e.step;
    if (e.has_loss) {
      j["loss"] = FiniteOrNull(e.loss);
      j["targets"] = e.targets;
      j["bits_per_byte"] = FiniteOrNull(e.bits_per_byte);
    }
    if (e.has_retrieval) {
      j["retrieval"] = {{"depth", e.retrieval_depth},
                        {"seq_len", e.retrieval_seq_len},
                        {"examples", e.retrieval.examples},
                        {"exact", e.retrieval.exact},
                        {"answer_tokens", e.retrieval.answer_tokens},
                        {"correct_tokens", e.retrieval.correct_tokens}};
    }
    evals.push_back(std::move(j));
  }
  extra["history"] = {{"train", std::move(train)}, {"evals", std::move(evals)}};
  return extra.dump();
}

absl::Status Trainer::RestoreExtra(const std::string& extra_json, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat(where, ": field \"extra\" of the trainer state: ", what));
  };
  Json extra;
  try {
    extra = Json::parse(extra_json);
    history_ = TrainingHistory();
    consecutive_skips_ = extra.at("consecutive_skips").get<int64_t>();
    for (const Json& p : extra.at("history").at("train")) {
      history_.train.push_back({p.at(0).get<int64_t>(), NumberOrNan(p.at(1))});
    }
    for (const Json& j : extra.at("history").at("evals")) {
      EvalResult e;
      e.step = j.at("step").get<int64_t>();
      if (j.contains("loss")) {
        e.has_loss = true;
        e.loss = NumberOrNan(j.at("loss"));
        e.targets = j.at("targets").get<int64_t>();
        e.bits_per_byte = NumberOrNan(j.at("bits_per_byte"));
      }
      if (j.contains("retrieval")) {
        const Json& r = j.at("retrieval");
        e.has_retrieval = true;
        e.retrieval_depth = r.at("depth").get<double>();
        e.retrieval_seq_len = r.at("seq_len").get<int64_t>();
        e.retrieval.examples = r.at("examples").get<int64_t>();
        e.retrieval.exact = r.at("exact").get<int64_t>();
        e.retrieval.answer_tokens = r.at("answer_tokens").get<int64_t>();
        e.retrieval.correct_tokens = r.at("correct_tokens").get<int64_t>();
      }
      history_.evals.push_back(e);
    }
    // Settings that changed since the checkpoint (allowed: they apply from the next step on).
    resume_notes_.clear();
    if (extra.contains("trainer_config")) {
      resume_notes_ =
          Differences(extra.at("trainer_config"), Json::parse(TrainerConfigToJson(config_)));
    }
  } catch (const Json::exception& e) {
    return bad(e.what());
  }
  return absl::OkStatus();
}

TrainerState Trainer::TrainerStateNow() const {
  TrainerState ts;
  ts.step = step_;
  ts.tokens_seen = tokens_seen_;
  ts.sampler = train_sampler_->cursor();
  ts.rng_state = rng_.state();
  ts.schedule = config_.schedule();
  ts.adamw = config_.adamw();
  ts.max_grad_norm = config_.optimizer.max_grad_norm;
  ts.extra_json = ExtraJson();
  return ts;
}

absl::StatusOr<std::string> Trainer::Save() {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("Trainer::Save: no checkpoint folder was given");
  }
  if (last_saved_step_ == step_) return last_saved_path_;
  if (collective_->world() > 1) return SaveSharded();
  const ParamLayout& layout = model_->layout();
  const size_t total = static_cast<size_t>(layout.total());
  std::vector<float> params(total);
  TRAINER_RETURN_IF_ERROR(model_->ReadParams(0, absl::MakeSpan(params)));
  AdamWState state;
  state.step = updates_;
  state.m.resize(total);
  state.v.resize(total);
  TRAINER_RETURN_IF_ERROR(
      optimizer_->ReadMoments(absl::MakeSpan(state.m), absl::MakeSpan(state.v)));
  CheckpointContents contents;
  contents.layout = &layout;
  contents.params = params;
  contents.optimizer = &state;
  contents.model_config_json = ConfigToJson(config_.model);
  contents.trainer = TrainerStateNow();
  absl::StatusOr<std::string> path = SaveCheckpoint(options_.checkpoint_dir, contents);
  if (!path.ok()) return path.status();
  absl::StatusOr<std::vector<std::string>> removed =
      PruneCheckpoints(options_.checkpoint_dir, config_.checkpoint.keep_last);
  if (!removed.ok()) return removed.status();
  last_saved_step_ = step_;
  last_saved_path_ = *path;
  return path;
}

absl::StatusOr<std::string> Trainer::SaveSharded() {
  const std::string& root = options_.checkpoint_dir;
  const int rank = collective_->rank();
  const int world = collective_->world();
  const ParamLayout& layout = model_->layout();
  // 1. Rank 0 makes the temporary folder; the others wait for it (and for its errors).
  absl::Status begun = absl::OkStatus();
  if (rank == 0) begun = BeginShardedCheckpoint(root, step_).status();
  TRAINER_RETURN_IF_ERROR(AgreeOnStatus(begun));
  const std::string tmp = JoinPath(root, absl::StrCat(".", CheckpointFolderName(step_), ".tmp"));
  // 2. Every rank writes its weights file (its whole tensors, from its copy of the parameters)
  // and its shard of the moments, and the ranks share their files' sizes and digests.
  auto write = [&]() -> absl::StatusOr<std::vector<CheckpointFile>> {
    const ElementRange weights = WeightsShardRange(layout, rank, world);
    std::vector<float> params(static_cast<size_t>(weights.size()));
    TRAINER_RETURN_IF_ERROR(model_->ReadParams(weights.begin, absl::MakeSpan(params)));
    const ShardRange mine = shards_[static_cast<size_t>(rank)];
    std::vector<float> m(static_cast<size_t>(mine.size())), v(m.size());
    TRAINER_RETURN_IF_ERROR(optimizer_->ReadMoments(absl::MakeSpan(m), absl::MakeSpan(v)));
    CheckpointShard shard;
    shard.layout = &layout;
    shard.shard = rank;
    shard.shards = world;
    shard.step = step_;
    shard.weights_begin = weights.begin;
    shard.params = params;
    shard.moments_begin = mine.begin;
    shard.m = m;
    shard.v = v;
    shard.optimizer_step = updates_;
    return WriteCheckpointShard(tmp, shard);
  };
  absl::StatusOr<std::vector<CheckpointFile>> written = write();
  Json mine = Json::array();
  if (written.ok()) {
    for (const CheckpointFile& f : *written) {
      mine.push_back(Json{{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
    }
  }
  absl::Status wrote = AgreeOnStatus(written.status());
  absl::StatusOr<std::vector<std::string>> lists =
      wrote.ok() ? collective_->AllGatherBytes(mine.dump()) : wrote;
  if (!lists.ok()) {
    if (rank == 0) (void)AbortShardedCheckpoint(root, step_);
    return lists.status();
  }
  // 3. Rank 0 writes the rest, the manifest last, renames and prunes; every rank gets its result.
  absl::StatusOr<std::string> path = JoinPath(root, CheckpointFolderName(step_));
  if (rank == 0) {
    ShardedCheckpointCommit commit;
    commit.layout = &layout;
    commit.shards = world;
    commit.model_config_json = ConfigToJson(config_.model);
    commit.trainer = TrainerStateNow();
    for (const std::string& list : *lists) {
      for (const Json& f : Json::parse(list)) {
        commit.shard_files.push_back(CheckpointFile{f.at("name").get<std::string>(),
                                                    f.at("bytes").get<int64_t>(),
                                                    f.at("sha256").get<std::string>()});
      }
    }
    path = CommitShardedCheckpoint(root, commit);
    if (path.ok()) {
      absl::StatusOr<std::vector<std::string>> removed =
          PruneCheckpoints(root, config_.checkpoint.keep_last);
      if (!removed.ok()) path = removed.status();
    } else {
      (void)AbortShardedCheckpoint(root, step_);
    }
  }
  TRAINER_RETURN_IF_ERROR(AgreeOnStatus(path.status()));
  last_saved_step_ = step_;
  last_saved_path_ = JoinPath(root, CheckpointFolderName(step_));
  return last_saved_path_;
}

absl::Status Trainer::Resume() {
  const std::string& root = options_.checkpoint_dir;
  if (root.empty()) {
    return absl::FailedPreconditionError("Trainer::Resume: no checkpoint folder was given");
  }
  const int rank = collective_->rank();
  const ShardRange mine = shards_[static_cast<size_t>(rank)];
  const ParamLayout& layout = model_->layout();
  std::vector<float> params(static_cast<size_t>(layout.total()));
  std::vector<float> m(static_cast<size_t>(mine.size())), v(m.size());
  std::vector<CheckpointEntry> all;
  CheckpointEntry latest;
  std::vector<std::pair<std::string, std::string>> moves;  // Incomplete folder -> aside.
  int64_t updates = 0;
  absl::StatusOr<Rng> rng = Rng::FromState({1, 0, 0, 0});
  // Every rank reads on its own: the newest complete checkpoint, verified, all the weights and
  // this rank's range of the moments (whatever number of ranks wrote it).
  auto read = [&]() -> absl::Status {
    // The newest complete step folder (one with a manifest). The writer never leaves a step
    // folder without one (it renames a finished folder into place), so a newer folder without
    // one was damaged or copied in part: it is moved aside below, once the complete one has been
    // read.
    absl::StatusOr<std::vector<CheckpointEntry>> listed = ListCheckpoints(root);
    if (!listed.ok()) return listed.status();
    all = *std::move(listed);
    const CheckpointEntry* newest = nullptr;
    for (auto it = all.rbegin(); it != all.rend() && newest == nullptr; ++it) {
      if (it->has_manifest) newest = &*it;
    }
    if (newest == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "no complete checkpoint under ", root,
          all.empty() ? std::string()
                      : absl::StrCat(" (", all.size(), " step folder", all.size() == 1 ? "" : "s",
                                     " without ", kManifestFile, ")")));
    }
    latest = *newest;
    // A complete folder that does not verify is damaged: an error naming the file, never
    // silently passed over for an older one.
    absl::StatusOr<Checkpoint> ck = Checkpoint::Open(latest.path, /*verify_checksums=*/true);
    if (!ck.ok()) return WithPrefix(ck.status(), absl::StrCat("cannot resume from ", root, ": "));
    const std::string config_file = JoinPath(latest.path, kConfigFile);
    absl::StatusOr<LongNetConfig> saved = ParseConfigJson(ck->model_config_json());
    if (!saved.ok()) {
      return absl::DataLossError(absl::StrCat(config_file, ": ", saved.status().message()));
    }
    if (*saved != config_.model) {
      const std::vector<std::string> diff =
          Differences(Json::parse(ConfigToJson(*saved)), Json::parse(ConfigToJson(config_.model)));
      return absl::FailedPreconditionError(
          absl::StrCat(config_file,
                       ": the checkpoint's model differs from this run's (trainer config field "
                       "\"model\"): ",
                       absl::StrJoin(diff, "; ")));
    }
    TRAINER_RETURN_IF_ERROR(ck->ReadWeights(layout, 0, absl::MakeSpan(params)));
    TRAINER_RETURN_IF_ERROR(
        ck->ReadMoments(layout, mine.begin, absl::MakeSpan(m), absl::MakeSpan(v)));
    updates = ck->optimizer_step();
    const TrainerState& ts = ck->trainer_state();
    const std::string state_file = JoinPath(latest.path, kTrainerStateFile);
    absl::Status cursor = train_sampler_->Restore(ts.sampler);
    if (!cursor.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(state_file,
                       ": the checkpoint's data cursor does not fit this run (its seed, seq_len, "
                       "batch_size or split differ): ",
                       cursor.message()));
    }
    rng = Rng::FromState(ts.rng_state);
    if (!rng.ok()) {
      return absl::DataLossError(absl::StrCat(state_file, ": ", rng.status().message()));
    }
    TRAINER_RETURN_IF_ERROR(RestoreExtra(ts.extra_json, state_file));
    step_ = ts.step;
    tokens_seen_ = ts.tokens_seen;
    // Where the newer incomplete folders go, named before rank 0 moves any (after every rank has
    // read, below).
    for (const CheckpointEntry& e : all) {
      if (e.step <= latest.step) continue;
      std::string aside = absl::StrCat(e.path, ".incomplete");
      for (int i = 2; fs::exists(aside); ++i) aside = absl::StrCat(e.path, ".incomplete-", i);
      moves.emplace_back(e.path, aside);
    }
    return absl::OkStatus();
  };
  TRAINER_RETURN_IF_ERROR(AgreeOnStatus(read()));
  // The ranks must have read the same checkpoint (they list one shared folder; a save in between
  // or a folder that is not shared would make them differ).
  if (collective_->world() > 1) {
    absl::StatusOr<std::vector<double>> steps =
        collective_->AllGather({static_cast<double>(latest.step)});
    if (!steps.ok()) return steps.status();
    for (size_t r = 0; r < steps->size(); ++r) {
      if ((*steps)[r] != (*steps)[0]) {
        std::vector<std::string> seen;
        for (size_t q = 0; q < steps->size(); ++q) {
          seen.push_back(absl::StrCat("rank ", q, " step ", std::llround((*steps)[q])));
        }
        return absl::FailedPreconditionError(
            absl::StrCat("the ranks see different newest checkpoints under ", root, ": ",
                         absl::StrJoin(seen, ", "),
                         " (is the folder shared, and was nothing saved meanwhile?)"));
      }
    }
  }
  TRAINER_RETURN_IF_ERROR(model_->WriteParams(0, params));
  TRAINER_RETURN_IF_ERROR(optimizer_->WriteMoments(m, v));
  // Incomplete folders newer than this one: moved aside (not deleted, by rank 0), so that this
  // run can write those steps again.
  std::vector<std::string> notes;
  absl::Status moved = absl::OkStatus();
  for (const auto& [path, aside] : moves) {
    if (rank == 0) {
      std::error_code ec;
      fs::rename(path, aside, ec);
      if (ec) {
        moved = FileError("rename", path, ec.value());
        break;
      }
    }
    notes.push_back(
        absl::StrCat(path, " has no ", kManifestFile, " (incomplete): moved to ", aside));
  }
  TRAINER_RETURN_IF_ERROR(AgreeOnStatus(moved));
  resume_notes_.insert(resume_notes_.end(), notes.begin(), notes.end());
  rng_ = *rng;
  updates_ = updates;
  last_saved_step_ = step_;
  last_saved_path_ = latest.path;
  resumed_from_ = latest.path;
  return absl::OkStatus();
}

absl::Status Trainer::Run(const RunCallbacks& callbacks) {
  const bool can_eval = validation_sampler_.has_value() || eval_task_.has_value();
  const bool can_save = !options_.checkpoint_dir.empty();
  auto evaluate = [&]() -> absl::Status {
    absl::StatusOr<EvalResult> e = Evaluate();
    if (!e.ok()) return e.status();
    if (callbacks.on_eval) callbacks.on_eval(*e);
    return absl::OkStatus();
  };
  auto save = [&]() -> absl::Status {
    if (!can_save) return absl::OkStatus();
    const bool fresh = last_saved_step_ != step_;
    absl::StatusOr<std::string> path = Save();
    if (!path.ok()) return path.status();
    if (fresh && callbacks.on_checkpoint) callbacks.on_checkpoint(*path, step_);
    return absl::OkStatus();
  };
  if (can_eval && config_.eval.every > 0 && step_ == 0 && history_.evals.empty()) {
    TRAINER_RETURN_IF_ERROR(evaluate());
  }
  while (step_ < config_.steps) {
    // With several ranks the decision is collective: every rank stops at the same step.
    absl::StatusOr<std::vector<int>> asking =
        RanksAskingToStop(callbacks.stop != nullptr && callbacks.stop->load());
    if (!asking.ok()) return asking.status();
    if (!asking->empty()) {
      TRAINER_RETURN_IF_ERROR(save());
      return absl::CancelledError(absl::StrCat(
          "stopped by request",
          collective_->world() > 1 ? absl::StrCat(" of rank", asking->size() == 1 ? " " : "s ",
                                                  absl::StrJoin(*asking, ", "))
                                   : std::string(),
          " after step ", step_,
          can_save ? absl::StrCat("; checkpoint ", last_saved_path_) : std::string()));
    }
    absl::StatusOr<StepResult> result = Step();
    if (!result.ok()) return result.status();
    if (callbacks.on_step) callbacks.on_step(*result);
    const bool last = step_ == config_.steps;
    if (can_eval && (last || (config_.eval.every > 0 && step_ % config_.eval.every == 0))) {
      TRAINER_RETURN_IF_ERROR(evaluate());
    }
    if (last || (config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0)) {
      TRAINER_RETURN_IF_ERROR(save());
    }
  }
  return absl::OkStatus();
}

#undef TRAINER_RETURN_IF_ERROR

}  // namespace model
}  // namespace dattn
