// Embedding + LSTM + linear sentiment classifier over padded variable-length batches
// (pack_padded_sequence). The corpus is synthetic: token sequences of 5-40 words from a 1000-word
// vocabulary where words 1-50 are "positive" and 51-100 "negative"; the label says which kind a
// sequence has more of.
//   ddprun --nproc_per_node 2 lstm_classifier --epochs 3
#include "common/trainer.hpp"

using namespace ddprun::examples;

constexpr int64_t kVocab = 1000, kMaxLen = 40;

struct LstmClassifierImpl : torch::nn::Module {
  LstmClassifierImpl()
      : embedding(
            register_module("embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocab, 32).padding_idx(0)))),
        lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(32, 64).batch_first(true)))),
        head(register_module("head", torch::nn::Linear(64, 2))) {}
  torch::Tensor forward(torch::Tensor tokens, torch::Tensor lengths) {
    auto packed = torch::nn::utils::rnn::pack_padded_sequence(embedding(tokens), lengths.cpu(), /*batch_first=*/true,
                                                              /*enforce_sorted=*/false);
    auto [output, state] = lstm->forward_with_packed_input(packed);
    return head(std::get<0>(state)[-1]);  // last layer's final hidden state
  }
  torch::nn::Embedding embedding;
  torch::nn::LSTM lstm;
  torch::nn::Linear head;
};

Dataset synthetic_reviews(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  Dataset d;
  d.lengths = torch::randint(5, kMaxLen + 1, {n}, torch::kLong);
  d.inputs = torch::randint(1, kVocab, {n, kMaxLen}, torch::kLong);
  const auto positions = torch::arange(kMaxLen).unsqueeze(0);
  d.inputs.masked_fill_(positions >= d.lengths.unsqueeze(1), 0);  // padding
  const auto pos = (d.inputs >= 1).logical_and(d.inputs <= 50).sum(1);
  const auto neg = (d.inputs >= 51).logical_and(d.inputs <= 100).sum(1);
  d.labels = (pos > neg).to(torch::kLong);
  return d;
}

int main(int argc, char** argv) {
  ExampleFlags defaults;
  defaults.epochs = 3;
  defaults.batch_size = 64;
  defaults.lr = 0.05;
  const auto flags = parse_example_flags(argc, argv, "lstm_classifier",
                                         "Embedding + LSTM + linear on padded variable-length sequences.", defaults);
  try {
    const auto train = synthetic_reviews(flags.train_limit > 0 ? flags.train_limit : 20000, 1);
    const auto test = synthetic_reviews(flags.test_limit > 0 ? flags.test_limit : 2000, 2);
    torch::manual_seed(static_cast<uint64_t>(flags.seed));
    return train_classifier("lstm_classifier", flags, std::make_shared<LstmClassifierImpl>(), train, test,
                            Loss::CrossEntropy);
  } catch (const std::exception& e) {
    std::cerr << "lstm_classifier: " << e.what() << "\n";
    return 1;
  }
}
