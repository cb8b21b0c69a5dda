// `llm.chat`: an OpenAI-compatible chat completion (POST
// BASE_URL/chat/completions), made by the host with the host's API key. Works
// with OpenAI and any compatible server (llama.cpp, vLLM, Ollama's /v1).
//
// Arguments: {"messages": [{"role": "user", "content": "..."}],
//             "model": "...", "temperature": 0.2, "max_tokens": 256}
//            (all but messages optional). Only these fields reach the
//            server; any other is dropped (a server may act on fields the
//            host never checked, e.g. fetch an image URL):
//              model, max_tokens, max_completion_tokens, temperature, top_p,
//              stop, seed, presence_penalty, frequency_penalty, n (1 only),
//              tools, tool_choice, parallel_tool_calls, response_format;
//            a message keeps role, content, name, tool_calls, tool_call_id;
//            content is a string, null, or an array of {"type": "text",
//            "text"} parts and, when the grant sets images, {"type":
//            "image_url", "image_url": {"url", "detail"}} parts (an image
//            without that grant is refused). "stream" is the host's choice.
// Result:    {"content": "...", "role": "assistant", "model": "...",
//             "finish_reason": "stop", "usage": {...}}
//            plus "tool_calls" when the model returned some.
// While streaming, each token is emitted live as
//   {"type": "token", "tool": "llm.chat", "seq": SEQ, "text": "..."}
// and only the final message is journaled.
//
// Token budget: with max_total_tokens set, a call made when the run's llm.chat
// calls have already used that many tokens (counted by tokens_counted from
// their journaled results, so a resumed run counts what it spent before) is
// refused, and a call's max_tokens is lowered to what is left. A reply may
// still pass the budget by its prompt tokens; the next call is then refused.
#pragma once

#include <chrono>
#include <cstdint>
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
  bool images = false;                // image_url parts may reach the server
  std::uint64_t max_total_tokens = 0; // over all the run's llm.chat calls; 0: no budget
};

// The tokens a call's result counts against max_total_tokens: its
// usage.total_tokens (prompt + completion when the server gave no total).
std::uint64_t tokens_counted(const json& result);

// LLM calls are idempotent (a repeated call costs tokens, not correctness).
// Without an endpoint every call fails with tool_error("unavailable") that
// says which variables to set.
// `tokens_spent`: what the run's earlier, journaled calls counted.
std::unique_ptr<tool> make_llm_chat(llm_chat_grant grant, std::optional<llm_endpoint> endpoint,
                                    std::uint64_t tokens_spent = 0);

}  // namespace cairn::engine
