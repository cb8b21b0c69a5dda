// `llm.chat`: an OpenAI-compatible chat completion (POST
// BASE_URL/chat/completions), made by the host with the host's API key. Works
// with OpenAI and any compatible server (llama.cpp, vLLM, Ollama's /v1).
//
// Arguments: {"messages": [{"role": "user", "content": "..."}],
//             "model": "...", "temperature": 0.2, "max_tokens": 256}
//            (all but messages optional; other OpenAI fields pass through,
//             except "stream" and "model" which the host decides)
// Result:    {"content": "...", "role": "assistant", "model": "...",
//             "finish_reason": "stop", "usage": {...}}
//            plus "tool_calls" when the model returned some.
// While streaming, each token is emitted live as
//   {"type": "token", "tool": "llm.chat", "seq": SEQ, "text": "..."}
// and only the final message is journaled.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tools/tool.hpp"

namespace cairn::engine {

// Where the host sends chat requests. Never enters a sandbox.
struct llm_endpoint {
  std::string base_url;  // e.g. "https://api.openai.com/v1", "http://127.0.0.1:8080/v1"
  std::string api_key;   // may be empty for local servers
  std::string model;     // used when the call names none
};

// From CAIRN_LLM_BASE_URL, CAIRN_LLM_API_KEY and CAIRN_LLM_MODEL, each
// overriding the "llm" object of the JSON config file `config` (when it
// exists): {"llm": {"base_url": ..., "api_key": ..., "model": ...}}.
// nullopt when no base URL is configured.
std::optional<llm_endpoint> llm_endpoint_from_host(const std::string& config_file);

struct llm_chat_grant {
  std::vector<std::string> models;  // allowed model names; empty: any
  int max_tokens = 4096;            // cap on the call's max_tokens (and the default)
  std::chrono::milliseconds timeout{120'000};
  bool stream = true;               // relay tokens live
  std::size_t max_response_bytes = 8 << 20;
};

// LLM calls are idempotent (a repeated call costs tokens, not correctness).
// Without an endpoint every call fails with tool_error("unavailable") that
// says which variables to set.
std::unique_ptr<tool> make_llm_chat(llm_chat_grant grant, std::optional<llm_endpoint> endpoint);

}  // namespace cairn::engine
