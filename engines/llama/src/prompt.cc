// Engine: tokenization and chat prompts.
#include <kdn/llama/engine.h>

#include <llama.h>

#include <climits>
#include <string>

namespace kdn::llama {

Result<std::vector<int32_t>> Engine::tokenize(std::string_view text, bool add_bos, bool special) const {
  if (text.size() > INT32_MAX / 2) return Status(Code::kInvalidArgument, "text too long");
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::vector<int32_t> out(text.size() + 2);
  const auto len = static_cast<int32_t>(text.size());
  int32_t n = llama_tokenize(vocab, text.data(), len, out.data(), static_cast<int32_t>(out.size()), add_bos, special);
  if (n < 0) {  // more tokens than bytes + 2 (never for byte-level BPE, but the API allows it)
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), len, out.data(), static_cast<int32_t>(out.size()), add_bos, special);
  }
  if (n < 0) return Status(Code::kInternal, "llama_tokenize failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string Engine::detokenize(std::span<const int32_t> tokens) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::string text(tokens.size() * 8 + 16, '\0');
  const auto n_tok = static_cast<int32_t>(tokens.size());
  int32_t n =
      llama_detokenize(vocab, tokens.data(), n_tok, text.data(), static_cast<int32_t>(text.size()), true, false);
  if (n < 0) {
    text.resize(static_cast<size_t>(-n));
    n = llama_detokenize(vocab, tokens.data(), n_tok, text.data(), static_cast<int32_t>(text.size()), true, false);
  }
  text.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return text;
}

Result<std::vector<int32_t>> Engine::document_prefix(std::string_view document, uint32_t context_tokens) const {
  return prompt_parts(document, "", context_tokens, /*with_tail=*/false);
}

Result<std::vector<int32_t>> Engine::chat_prompt(std::string_view document, std::string_view question,
                                                 uint32_t context_tokens) const {
  return prompt_parts(document, question, context_tokens, /*with_tail=*/true);
}

Result<std::vector<int32_t>> Engine::prompt_parts(std::string_view document, std::string_view question,
                                                  uint32_t context_tokens, bool with_tail) const {
  const std::string message = std::string(document) + "\n\n" + std::string(question);
  const char* tmpl = llama_model_chat_template(model_, nullptr);
  const llama_chat_message msg{"user", message.c_str()};
  std::string chat(message.size() + 256, '\0');
  int32_t n = llama_chat_apply_template(tmpl, &msg, 1, true, chat.data(), static_cast<int32_t>(chat.size()));
  if (n > static_cast<int32_t>(chat.size())) {
    chat.resize(static_cast<size_t>(n));
    n = llama_chat_apply_template(tmpl, &msg, 1, true, chat.data(), n);
  }
  if (n < 0) return Status(Code::kUnsupported, "the model's chat template is not supported");
  chat.resize(static_cast<size_t>(n));

  // Tokenize the parts around the document separately, so the document's tokens (and hence
  // the chunk keys) never depend on the question that follows it.
  const size_t at = chat.find(message);
  if (at == std::string::npos) return Status(Code::kUnsupported, "chat template rewrites the message");
  const bool add_bos = llama_vocab_get_add_bos(llama_model_get_vocab(model_));
  Result<std::vector<int32_t>> head = tokenize(std::string_view(chat).substr(0, at), add_bos, true);
  Result<std::vector<int32_t>> doc = tokenize(document, false, false);
  Result<std::vector<int32_t>> tail =
      with_tail ? tokenize(std::string_view(chat).substr(at + document.size()), false, true) : std::vector<int32_t>{};
  if (!head.ok() || !doc.ok() || !tail.ok()) return Status(Code::kInternal, "tokenization failed");
  if (context_tokens > 0) {
    if (context_tokens < head->size() || context_tokens - head->size() > doc->size())
      return Status(Code::kInvalidArgument, "document shorter than the requested context");
    doc->resize(context_tokens - head->size());
  }
  std::vector<int32_t> prompt = std::move(head.value());
  prompt.insert(prompt.end(), doc->begin(), doc->end());
  prompt.insert(prompt.end(), tail->begin(), tail->end());
  return prompt;
}

}  // namespace kdn::llama
