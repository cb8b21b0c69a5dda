// llm.chat: arguments, result, events and grant are described in llm_chat.hpp.
// Wire format: OpenAI's chat completions, streamed as server-sent events
// ("data: {chunk}\n\n" ... "data: [DONE]\n\n") when the grant streams.
#include "engine/tools/llm_chat.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "engine/tools/http_client.hpp"
#include "protocol/bounded_json.hpp"
#include "protocol/text.hpp"

namespace cairn::engine {

namespace {

const std::string tool_name = "llm.chat";

[[noreturn]] void refuse(const std::string& message) { throw tool_error("refused", tool_name + ": " + message); }

[[noreturn]] void bad_output(const std::string& message) {
  throw tool_error("bad_output", tool_name + ": " + message);
}

// What the endpoint sent, as a message quotes it: its start, without trailing whitespace.
std::string server_text(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return protocol::clip(text, 300);
}

// `text` with every occurrence of `secret` (when not empty) replaced.
std::string redacted(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (auto at = text.find(secret); at != std::string::npos; at = text.find(secret, at))
    text.replace(at, secret.size(), "[redacted]");
  return text;
}

void redact(json& value, const std::string& secret) {
  if (value.is_string())
    value = redacted(value.get<std::string>(), secret);
  else if (value.is_structured())
    for (auto& item : value) redact(item, secret);
}

// The server's text as JSON; a discarded value when it is not JSON or breaks the bounds.
json parse_reply(std::string_view text) {
  try {
    return protocol::parse_bounded(text, "the LLM endpoint's answer", {max_result_depth, text.size()});
  } catch (const protocol::json_error&) {
    return json(json::value_t::discarded);
  }
}

// Why parse_reply discarded `text`, for messages.
std::string not_json_reason(std::string_view text) {
  return protocol::nesting_depth(text) > max_result_depth
             ? fmt::format("nests deeper than {} levels ({} bytes)", max_result_depth, text.size())
             : "is not a JSON object: " + server_text(text);
}

std::string error_detail(const std::string& body) {
  json doc = parse_reply(body);
  if (doc.is_object() && doc.contains("error")) {
    const auto& error = doc["error"];
    if (error.is_string()) return server_text(error.get<std::string>());
    if (error.is_object() && error.contains("message") && error["message"].is_string())
      return server_text(error["message"].get<std::string>());
  }
  return body.empty() ? "(no details)" : server_text(body);
}

// Live events are not durable: a failing watcher must not fail the call.
void emit_token(const tool_call& call, const std::string& text) {
  try {
    call.emit({{"type", "token"}, {"tool", tool_name}, {"seq", call.seq}, {"text", text}});
  } catch (const std::exception&) {
  }
}

json parse_completion(const std::string& body, const std::string& requested_model) {
  json doc = parse_reply(body);
  if (!doc.is_object()) bad_output("the LLM endpoint's answer " + not_json_reason(body));
  if (doc.contains("error"))
    throw tool_error("failed", tool_name + ": the LLM endpoint reported: " + error_detail(body));
  const json* message = nullptr;
  if (doc.contains("choices") && doc["choices"].is_array() && !doc["choices"].empty() &&
      doc["choices"][0].is_object() && doc["choices"][0].contains("message") &&
      doc["choices"][0]["message"].is_object())
    message = &doc["choices"][0]["message"];
  if (!message) bad_output("the LLM endpoint's answer has no choices[0].message: " + server_text(body));
  const auto& choice = doc["choices"][0];
  json out = {{"content", message->value("content", json()).is_string() ? (*message)["content"] : json("")},
              {"role", message->value("role", json()).is_string() ? (*message)["role"] : json("assistant")},
              {"model", doc.value("model", json()).is_string() ? doc["model"] : json(requested_model)},
              {"finish_reason", choice.value("finish_reason", json())}};
  if (doc.contains("usage") && doc["usage"].is_object()) out["usage"] = doc["usage"];
  if (message->contains("tool_calls") && (*message)["tool_calls"].is_array() && !(*message)["tool_calls"].empty())
    out["tool_calls"] = (*message)["tool_calls"];
  return out;
}

// Assembles a streamed completion from server-sent events, emitting each
// piece of content as a token event as it arrives. `secret` is removed from
// every event before it is read.
class stream_assembler {
 public:
  stream_assembler(const tool_call& call, std::string model, std::string secret)
      : call_(call), secret_(std::move(secret)) {
    out_["model"] = std::move(model);
  }

  void feed(std::string_view bytes) {
    buffer_ += bytes;
    for (auto end = buffer_.find('\n'); end != std::string::npos; end = buffer_.find('\n')) {
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) {
        dispatch();
      } else if (line.starts_with("data:")) {
        std::string_view value = std::string_view(line).substr(5);
        if (value.starts_with(' ')) value.remove_prefix(1);
        if (!data_.empty()) data_ += '\n';
        data_ += value;
      }  // other fields (event:, id:, comments) carry nothing here
    }
  }

  bool done() const { return done_; }

  json finish() {
    if (!buffer_.empty()) feed("\n");
    dispatch();
    if (!got_chunk_) bad_output("the LLM endpoint's stream held no completion chunk");
    if (!done_ && out_["finish_reason"].is_null())
      throw tool_error("unavailable", tool_name + ": the LLM endpoint ended the stream before the reply was complete");
    out_["content"] = content_;
    if (!tool_calls_.empty()) out_["tool_calls"] = tool_calls_;
    return out_;
  }

 private:
  void dispatch() {
    std::string data = redacted(std::move(data_), secret_);
    data_.clear();
    if (data.empty() || done_) return;
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    json chunk = parse_reply(data);
    if (!chunk.is_object()) bad_output("the LLM endpoint streamed a chunk that " + not_json_reason(data));
    if (chunk.contains("error"))
      throw tool_error("failed", tool_name + ": the LLM endpoint reported mid-stream: " + error_detail(data));
    got_chunk_ = true;
    if (chunk.value("model", json()).is_string()) out_["model"] = chunk["model"];
    if (chunk.value("usage", json()).is_object()) out_["usage"] = chunk["usage"];
    if (!chunk.value("choices", json()).is_array() || chunk["choices"].empty()) return;
    const auto& choice = chunk["choices"][0];
    if (!choice.is_object()) bad_output("the LLM endpoint streamed a choice that is not an object: " + server_text(data));
    if (choice.value("finish_reason", json()).is_string()) out_["finish_reason"] = choice["finish_reason"];
    if (!choice.value("delta", json()).is_object()) return;
    const auto& delta = choice["delta"];
    if (delta.value("role", json()).is_string()) out_["role"] = delta["role"];
    if (delta.value("content", json()).is_string()) token(delta["content"].get<std::string>());
    if (delta.value("tool_calls", json()).is_array())
      for (const auto& part : delta["tool_calls"]) add_tool_call(part);
  }

  void token(const std::string& text) {
    if (text.empty()) return;
    content_ += text;
    emit_token(call_, text);
  }

  // Tool call deltas arrive in pieces keyed by "index"; strings concatenate.
  void add_tool_call(const json& part) {
    if (!part.is_object()) return;
    auto index = part.value("index", json(0));
    if (!index.is_number_unsigned() || index.get<std::size_t>() > 255)
      bad_output("the LLM endpoint streamed a tool call with a bad index: " + server_text(part.dump()));
    while (tool_calls_.size() <= index.get<std::size_t>())
      tool_calls_.push_back({{"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
    auto& call = tool_calls_[index.get<std::size_t>()];
    for (const char* key : {"id", "type"})
      if (part.value(key, json()).is_string()) call[key] = part[key];
    if (!part.value("function", json()).is_object()) return;
    for (const char* key : {"name", "arguments"})
      if (part["function"].value(key, json()).is_string())
        call["function"][key] = call["function"][key].get<std::string>() + part["function"][key].get<std::string>();
  }

  const tool_call& call_;
  const std::string secret_;
  std::string buffer_, data_, content_;
  json out_ = {{"role", "assistant"}, {"finish_reason", nullptr}};
  json tool_calls_ = json::array();
  bool got_chunk_ = false, done_ = false;
};

// The agent's message `m` (messages[i]) as the server gets it: known fields only.
json message_body(const json& m, std::size_t i, bool images) {
  if (!m.is_object() || !m.value("role", json()).is_string())
    refuse(fmt::format("messages[{}] must be an object with a \"role\" string", i));
  json out = {{"role", m["role"]}};
  for (const char* key : {"name", "tool_call_id"})
    if (m.contains(key)) {
      if (!m[key].is_string()) refuse(fmt::format("messages[{}].{} must be a string", i, key));
      out[key] = m[key];
    }
  if (m.contains("tool_calls")) {
    if (!m["tool_calls"].is_array()) refuse(fmt::format("messages[{}].tool_calls must be an array", i));
    out["tool_calls"] = m["tool_calls"];
  }
  if (!m.contains("content")) return out;
  const auto& content = m["content"];
  if (content.is_string() || content.is_null()) {
    out["content"] = content;
    return out;
  }
  if (!content.is_array()) refuse(fmt::format("messages[{}].content must be a string, null or an array of parts", i));
  out["content"] = json::array();
  for (std::size_t j = 0; j < content.size(); ++j) {
    const auto& part = content[j];
    const auto type = part.is_object() ? part.value("type", json()) : json();
    if (type == "text" && part.value("text", json()).is_string()) {
      out["content"].push_back({{"type", "text"}, {"text", part["text"]}});
    } else if (type == "image_url") {
      if (!images)
        refuse(fmt::format("messages[{}].content[{}] is an image, and the grant does not allow images (set "
                           "\"images\": true in the llm.chat grant)", i, j));
      const auto& image = part.value("image_url", json());
      if (!image.is_object() || !image.value("url", json()).is_string())
        refuse(fmt::format("messages[{}].content[{}].image_url must be an object with a \"url\" string", i, j));
      json kept = {{"url", image["url"]}};
      if (image.value("detail", json()).is_string()) kept["detail"] = image["detail"];
      out["content"].push_back({{"type", "image_url"}, {"image_url", std::move(kept)}});
    } else {
      refuse(fmt::format("messages[{}].content[{}] must be {{\"type\": \"text\", \"text\": \"...\"}}{}", i, j,
                         images ? " or an image_url part" : ""));
    }
  }
  return out;
}

class llm_chat final : public tool {
 public:
  llm_chat(llm_chat_grant grant, std::optional<llm_endpoint> endpoint, std::uint64_t tokens_spent)
      : grant_(std::move(grant)), endpoint_(std::move(endpoint)), spent_(tokens_spent) {}

  const std::string& name() const override { return tool_name; }
  idempotency kind(const json&) const override { return idempotency::idempotent; }

  json call(const tool_call& call) override {
    if (!endpoint_)
      throw tool_error("unavailable", tool_name + ": no LLM endpoint is configured: set CAIRN_LLM_BASE_URL (and "
                                                  "CAIRN_LLM_API_KEY) on the host, or the \"llm\" object of "
                                                  "cairn's config file");
    if (grant_.max_total_tokens > 0 && spent_ >= grant_.max_total_tokens)
      refuse(fmt::format("this run's calls have used {} tokens, its grant's max_total_tokens is {}: no more calls",
                         spent_, grant_.max_total_tokens));
    // chat() scrubs the key from what the server sends before reading it
    // (so no clip can cut it in half); this catches anything else.
    const auto& key = endpoint_->api_key;
    try {
      json result = chat(call);
      if (!key.empty()) redact(result, key);
      // A server that reports no usage is charged the most the call could have used.
      if (grant_.max_total_tokens > 0 && !result.contains("usage"))
        result["usage"] = {{"total_tokens", std::min<std::uint64_t>(grant_.max_tokens, grant_.max_total_tokens - spent_)},
                           {"estimated", true}};
      spent_ += tokens_counted(result);
      return result;
    } catch (const tool_error& e) {
      throw tool_error(e.type(), redacted(e.what(), key));
    }
  }

 private:
  // The request body: the fields of the agent's arguments that llm_chat.hpp
  // lists, checked against the grant.
  json request_body(const json& args) const {
    if (!args.is_object()) refuse("arguments must be an object like {\"messages\": [...]}");
    const auto& messages = args.value("messages", json());
    if (!messages.is_array() || messages.empty())
      refuse("\"messages\" must be a non-empty array like [{\"role\": \"user\", \"content\": \"...\"}]");
    json body = {{"messages", json::array()}};
    for (std::size_t i = 0; i < messages.size(); ++i)
      body["messages"].push_back(message_body(messages[i], i, grant_.images));
    for (const char* field : {"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "tools",
                              "tool_choice", "parallel_tool_calls", "response_format"})
      if (args.contains(field)) body[field] = args[field];

    std::string model = endpoint_->model;
    if (args.contains("model")) {
      if (!args["model"].is_string()) refuse("\"model\" must be a string");
      model = args["model"].get<std::string>();
    }
    if (model.empty()) refuse("no model named: pass \"model\", or set CAIRN_LLM_MODEL on the host");
    if (!grant_.models.empty() && std::find(grant_.models.begin(), grant_.models.end(), model) == grant_.models.end())
      refuse(fmt::format("the model \"{}\" is not granted (allowed: {})", model, fmt::join(grant_.models, ", ")));
    body["model"] = model;

    long long left = grant_.max_total_tokens > 0 ? static_cast<long long>(grant_.max_total_tokens - spent_)
                                                 : std::numeric_limits<long long>::max();
    bool capped = false;
    for (const char* field : {"max_tokens", "max_completion_tokens"}) {
      if (!args.contains(field)) continue;
      const auto& value = args[field];
      if (!value.is_number_integer() || value.get<long long>() < 1)
        refuse(fmt::format("\"{}\" must be a positive integer", field));
      if (value.get<long long>() > grant_.max_tokens)
        refuse(fmt::format("\"{}\" is {}, above the grant's cap of {}", field, value.get<long long>(),
                           grant_.max_tokens));
      body[field] = std::min(value.get<long long>(), left);
      capped = true;
    }
    if (!capped) body["max_tokens"] = std::min<long long>(grant_.max_tokens, left);
    // Each extra choice costs a full completion and only the first is returned.
    if (args.contains("n") && args["n"] != 1) refuse("\"n\" must be 1: llm.chat returns one choice");
    if (grant_.stream) {
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
    }
    return body;
  }

  json chat(const tool_call& call) const {
    json body = request_body(call.args);
    http::url url;
    try {
      url = http::parse_url(endpoint_->base_url + "/chat/completions");
    } catch (const tool_error& e) {
      throw tool_error("unavailable", tool_name + ": the host's LLM base URL is not usable: " + e.what());
    }
    http::header_list headers = {{"Content-Type", "application/json"},
                                 {"Accept", grant_.stream ? "text/event-stream" : "application/json"}};
    const auto& key = endpoint_->api_key;
    if (!key.empty()) headers.emplace_back("Authorization", "Bearer " + key);

    auto deadline = std::chrono::steady_clock::now() + grant_.timeout;
    // The host's own endpoint, not the agent's choice: any address it names
    // may be reached (a model server on this machine included).
    http::exchange exchange({"POST", url, std::move(headers), body.dump()},
                            {.who = tool_name,
                             .deadline = deadline,
                             .timeout = grant_.timeout,
                             .max_body_bytes = grant_.max_response_bytes,
                             .refuse_address = {}});
    int status = exchange.status();
    if (status < 200 || status >= 300) {
      auto type = status == 429 || status >= 500 ? "unavailable" : "failed";
      throw tool_error(type, fmt::format("{}: the LLM endpoint answered {}: {}", tool_name, status,
                                         error_detail(redacted(exchange.read_all(), key))));
    }
    auto model = body["model"].get<std::string>();
    if (!exchange.header("content-type").value_or("").starts_with("text/event-stream")) {
      // Not streamed (not asked for, or a server that ignores "stream").
      json result = parse_completion(redacted(exchange.read_all(), key), model);
      if (grant_.stream && !result["content"].get<std::string>().empty())
        emit_token(call, result["content"].get<std::string>());
      return result;
    }
    stream_assembler stream(call, model, key);
    while (!stream.done()) {
      auto piece = exchange.read_some();
      if (!piece) break;
      stream.feed(*piece);
    }
    return stream.finish();
  }

  llm_chat_grant grant_;
  std::optional<llm_endpoint> endpoint_;
  std::uint64_t spent_;  // tokens counted so far in this run
};

// Sets `field` from llm[key] when present; throws when it is not a string.
void set_from(std::string& field, const json& llm, const char* key, const std::string& config_file) {
  if (!llm.contains(key)) return;
  if (!llm[key].is_string())
    throw std::runtime_error(fmt::format("{}: \"llm\".\"{}\" must be a string", config_file, key));
  field = llm[key].get<std::string>();
}

}  // namespace

std::optional<llm_endpoint> llm_endpoint_from_host(const std::string& config_file) {
  llm_endpoint endpoint;
  std::error_code ec;
  if (!config_file.empty() && std::filesystem::exists(config_file, ec)) {
    std::ifstream in(config_file);
    if (!in) throw std::runtime_error(fmt::format("{} exists but cannot be read", config_file));
    json config;
    try {
      config = json::parse(in);
    } catch (const json::parse_error& e) {
      throw std::runtime_error(fmt::format("{} is not valid JSON ({}); fix or remove it", config_file, e.what()));
    }
    if (!config.is_object()) throw std::runtime_error(fmt::format("{} must hold a JSON object", config_file));
    if (config.contains("llm")) {
      const auto& llm = config["llm"];
      if (!llm.is_object())
        throw std::runtime_error(fmt::format("{}: \"llm\" must be an object with base_url, api_key and model",
                                             config_file));
      set_from(endpoint.base_url, llm, "base_url", config_file);
      set_from(endpoint.api_key, llm, "api_key", config_file);
      set_from(endpoint.model, llm, "model", config_file);
    }
  }
  std::string base_url_source = config_file;
  if (const char* value = std::getenv("CAIRN_LLM_BASE_URL")) {
    endpoint.base_url = value;
    base_url_source = "CAIRN_LLM_BASE_URL";
  }
  if (const char* value = std::getenv("CAIRN_LLM_API_KEY")) endpoint.api_key = value;
  if (const char* value = std::getenv("CAIRN_LLM_MODEL")) endpoint.model = value;

  while (endpoint.base_url.ends_with('/')) endpoint.base_url.pop_back();
  if (endpoint.base_url.empty()) return std::nullopt;
  try {
    http::parse_url(endpoint.base_url);
  } catch (const tool_error& e) {
    throw std::runtime_error(fmt::format("the LLM base URL from {} is not usable: {}", base_url_source, e.what()));
  }
  return endpoint;
}

std::uint64_t tokens_counted(const json& result) {
  const auto& usage = result.is_object() ? result.value("usage", json()) : json();
  if (!usage.is_object()) return 0;
  auto count = [&](const char* key) {
    const auto& n = usage.value(key, json());
    return n.is_number_unsigned() ? n.get<std::uint64_t>() : 0;
  };
  return usage.contains("total_tokens") ? count("total_tokens") : count("prompt_tokens") + count("completion_tokens");
}

std::unique_ptr<tool> make_llm_chat(llm_chat_grant grant, std::optional<llm_endpoint> endpoint,
                                    std::uint64_t tokens_spent) {
  return std::make_unique<llm_chat>(std::move(grant), std::move(endpoint), tokens_spent);
}

}  // namespace cairn::engine
