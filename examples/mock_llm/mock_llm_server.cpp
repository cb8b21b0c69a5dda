// cairn-mock-llm: a local OpenAI-compatible chat server for `make demo` and the
// tool tests, plus the HTTP fixtures the http.fetch tests need. Listens on
// 127.0.0.1 only; one thread per connection, one request per connection.
//
//   POST /v1/chat/completions  a scripted or derived reply (content or tool calls);
//                              SSE when "stream": true
//   GET  /v1/models            the one model, "mock-model"
//   GET  /pages/NAME           the file NAME in --pages DIR
//   /redirect?to=URL           302 to URL (&status=301|303|307|308 for another code);
//   /redirect?n=K              302 to /redirect?n=K-1; n=0 answers 200
//   /status/N                  answers status N with an OpenAI-style error body
//   /slow?ms=N                 answers after N ms (default 5000)
//   /big?bytes=N               N bytes of 'x' (default 1000)
//   /echo                      the request as JSON: method, target, headers, body
//   /deep?levels=N             a chat completion whose "usage" nests N objects deep
//                              (default 300000), as a hostile model server sends
// Fixtures match on their first path segment and any method, so a base URL
// such as http://127.0.0.1:PORT/status/500 points an LLM client at one.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace fs = std::filesystem;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using request = http::request<http::string_body>;

struct settings {
  std::string require_key;  // empty: any Authorization is accepted
  std::string pages_dir;
  json script;  // {"replies": [reply, ...], "default": ...} or null; see --script
  std::size_t summary_bytes = 200;  // of the last user message, in a reply no script gives
};

// Live connections, so that shutdown can wake every thread blocked on one.
class connections {
 public:
  void enter(int fd) {
    std::lock_guard lock(mutex_);
    fds_.insert(fd);
    ++active_;
  }
  // Call before closing `fd`: stop() must never shut down a reused descriptor.
  void forget(int fd) {
    std::lock_guard lock(mutex_);
    fds_.erase(fd);
  }
  void done() {
    std::lock_guard lock(mutex_);
    --active_;
    changed_.notify_all();
  }
  // Sleeps `ms`; false when the server stops first.
  bool sleep_for(std::chrono::milliseconds ms) {
    std::unique_lock lock(mutex_);
    return !changed_.wait_for(lock, ms, [&] { return stopping_; });
  }
  // Wakes every connection and waits up to `limit` for their threads to end.
  bool stop(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    changed_.notify_all();
    return changed_.wait_for(lock, limit, [&] { return active_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::set<int> fds_;
  int active_ = 0;
  bool stopping_ = false;
};

// One JSON line per request, appended.
class request_log {
 public:
  explicit request_log(const std::string& path) {
    if (!path.empty()) out_.open(path, std::ios::app);
  }
  void write(const json& line) {
    if (!out_.is_open()) return;
    std::lock_guard lock(mutex_);
    out_ << line.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
  }

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

struct server {
  server(settings c, const std::string& log_file) : config(std::move(c)), log(log_file) {}
  settings config;
  request_log log;
  connections live;
};

std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

std::map<std::string, std::string> query_of(std::string_view target) {
  std::map<std::string, std::string> params;
  auto q = target.find('?');
  if (q == std::string_view::npos) return params;
  std::stringstream in(std::string(target.substr(q + 1)));
  for (std::string pair; std::getline(in, pair, '&');) {
    auto eq = pair.find('=');
    params[percent_decode(pair.substr(0, eq))] = eq == std::string::npos ? "" : percent_decode(pair.substr(eq + 1));
  }
  return params;
}

long number_param(const std::map<std::string, std::string>& params, const std::string& name, long fallback) {
  auto it = params.find(name);
  if (it == params.end()) return fallback;
  try {
    return std::stol(it->second);
  } catch (const std::exception&) {
    return -1;
  }
}

std::string text_of(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json openai_error(const std::string& message, const std::string& type, const json& code = nullptr) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
}

void send(tcp::socket& socket, const request& req, http::status status, const std::string& content_type,
          std::string body) {
  http::response<http::string_body> res{status, req.version()};
  res.set(http::field::server, "cairn-mock-llm");
  res.set(http::field::content_type, content_type);
  res.keep_alive(false);
  res.body() = std::move(body);
  res.prepare_payload();
  http::write(socket, res);
}

std::string repeat(std::string_view text, std::size_t times) {
  std::string out;
  out.reserve(text.size() * times);
  for (std::size_t i = 0; i < times; ++i) out += text;
  return out;
}

void send_json(tcp::socket& socket, const request& req, http::status status, const json& body) {
  send(socket, req, status, "application/json", text_of(body));
}

// The text of the last message with `role` ("" for any role), parts joined.
std::string last_message(const json& messages, const std::string& role) {
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    if (!it->is_object() || !it->contains("content")) continue;
    if (!role.empty() && it->value("role", "") != role) continue;
    const auto& content = (*it)["content"];
    if (content.is_string()) return content.get<std::string>();
    std::string text;
    if (content.is_array())
      for (const auto& part : content)
        if (part.is_object() && part.value("text", json()).is_string()) text += part["text"].get<std::string>();
    return text;
  }
  return "";
}

// FNV-1a, 64 bits, as 16 hex digits: tells requests apart in the log.
std::string fnv1a(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return fmt::format("{:016x}", h);
}

// The first `n` bytes of `s`, not cutting a UTF-8 character.
std::string utf8_prefix(const std::string& s, std::size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  return s.substr(0, n);
}

struct scripted_reply {
  std::string content;
  json tool_calls = json::array();  // in the API's shape: [{"id", "type": "function", "function": {...}}]
};

// The script's first reply whose conditions all hold: "match" in the last user
// message, "last" in the last message of any role (a tool's output, say),
// "system" in the system message (which agent is asking).
scripted_reply reply_to(const json& messages, const json& script, std::size_t summary_bytes) {
  auto user = last_message(messages, "user");
  if (script.is_object()) {
    auto holds = [&](const json& reply, const char* key, const std::string& text) {
      return text.find(reply.value(key, "")) != std::string::npos;
    };
    for (const auto& reply : script.value("replies", json::array())) {
      if (!holds(reply, "match", user) || !holds(reply, "last", last_message(messages, "")) ||
          !holds(reply, "system", last_message(messages, "system")))
        continue;
      scripted_reply out{reply.value("content", "")};
      for (const auto& call : reply.value("tool_calls", json::array())) {
        auto arguments = call["arguments"].is_string() ? call["arguments"].get<std::string>() : call["arguments"].dump();
        auto name = call["name"].get<std::string>();
        // Derived from the conversation, not a counter: the same request gets the same id.
        auto id = "call_" + fnv1a(fmt::format("{}/{}/{}/{}", messages.size(), out.tool_calls.size(), name, arguments));
        out.tool_calls.push_back(
            {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
      }
      return out;
    }
    if (script.value("default", json()).is_string()) return {script["default"].get<std::string>()};
  }
  return {"Summary: " + utf8_prefix(user, summary_bytes)};
}

// "a b  c" -> "a ", "b  ", "c": each token ends after its spaces.
std::vector<std::string> tokens_of(const std::string& text) {
  std::vector<std::string> tokens;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find_first_not_of(' ', text.find(' ', start));
    tokens.push_back(text.substr(start, end - start));
    start = end == std::string::npos ? text.size() : end;
  }
  return tokens;
}

std::size_t word_count(const json& messages) {
  std::size_t words = 0;
  for (const auto& m : messages)
    if (m.is_object() && m.value("content", json()).is_string())
      for (const auto& token : tokens_of(m["content"].get<std::string>()))
        words += token.find_first_not_of(' ') != std::string::npos;
  return words;
}

void write_sse(tcp::socket& socket, const json& event) {
  net::write(socket, http::make_chunk(net::buffer("data: " + text_of(event) + "\n\n")));
}

void chat_completions(tcp::socket& socket, const request& req, const server& s) {
  json body = json::parse(req.body(), nullptr, false);
  if (!body.is_object() || !body.value("messages", json()).is_array())
    return send_json(socket, req, http::status::bad_request,
                     openai_error("the body must be a JSON object with a \"messages\" array", "invalid_request_error"));
  static std::atomic<int> counter{0};
  std::string id = fmt::format("chatcmpl-mock-{}", ++counter);
  std::string model = body.value("model", json()).is_string() ? body["model"].get<std::string>() : "mock-model";
  auto reply = reply_to(body["messages"], s.config.script, s.config.summary_bytes);
  auto tokens = tokens_of(reply.content);
  std::string finish_reason = reply.tool_calls.empty() ? "stop" : "tool_calls";
  json limit = body.value("max_completion_tokens", body.value("max_tokens", json()));
  if (limit.is_number_unsigned() && tokens.size() > limit.get<std::size_t>()) {
    tokens.resize(limit.get<std::size_t>());
    finish_reason = "length";
  }
  std::string content;
  for (const auto& t : tokens) content += t;
  std::size_t prompt_tokens = word_count(body["messages"]);
  json usage = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", tokens.size()},
                {"total_tokens", prompt_tokens + tokens.size()}};
  auto now = std::chrono::system_clock::now().time_since_epoch();
  auto created = std::chrono::duration_cast<std::chrono::seconds>(now).count();

  if (body.value("stream", json(false)) != true) {
    json message = {{"role", "assistant"}, {"content", content}};
    if (!reply.tool_calls.empty()) {
      if (content.empty()) message["content"] = nullptr;
      message["tool_calls"] = reply.tool_calls;
    }
    return send_json(socket, req, http::status::ok,
                     {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                      {"choices", {{{"index", 0}, {"message", message}, {"finish_reason", finish_reason}}}},
                      {"usage", usage}});
  }

  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "cairn-mock-llm");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.keep_alive(false);
  head.chunked(true);
  http::response_serializer<http::empty_body> serializer{head};
  http::write_header(socket, serializer);
  auto chunk = [&](json delta, json finish) {
    return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                {"choices", {{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}}}}};
  };
  write_sse(socket, chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  for (const auto& t : tokens) write_sse(socket, chunk({{"content", t}}, nullptr));
  for (std::size_t i = 0; i < reply.tool_calls.size(); ++i) {
    json call = reply.tool_calls[i];
    call["index"] = i;
    write_sse(socket, chunk({{"tool_calls", json::array({call})}}, nullptr));
  }
  write_sse(socket, chunk(json::object(), finish_reason));
  const json& options = body.value("stream_options", json::object());
  if (options.is_object() && options.value("include_usage", json(false)) == true)
    write_sse(socket, {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                       {"choices", json::array()}, {"usage", usage}});
  net::write(socket, http::make_chunk(net::buffer(std::string("data: [DONE]\n\n"))));
  net::write(socket, http::make_chunk_last());
}

void page(tcp::socket& socket, const request& req, const server& s, const std::string& name) {
  fs::path file = fs::path(s.config.pages_dir) / name;
  std::ifstream in(file, std::ios::binary);
  if (s.config.pages_dir.empty() || name.empty() || name.find('/') != std::string::npos || name[0] == '.' || !in)
    return send(socket, req, http::status::not_found, "text/plain", "no such page: " + name + "\n");
  std::stringstream text;
  text << in.rdbuf();
  bool html = file.extension() == ".html" || file.extension() == ".htm";
  send(socket, req, http::status::ok, html ? "text/html; charset=utf-8" : "text/plain; charset=utf-8", text.str());
}

void big(tcp::socket& socket, const request& req, long bytes) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::content_type, "text/plain");
  head.content_length(bytes);
  head.keep_alive(false);
  http::response_serializer<http::empty_body> serializer{head};
  http::write_header(socket, serializer);
  std::string block(64 * 1024, 'x');
  for (long left = bytes; left > 0; left -= static_cast<long>(block.size()))
    net::write(socket, net::buffer(block.data(), std::min<long>(left, block.size())));
}

void respond(tcp::socket& socket, const request& req, server& s) {
  std::string target(req.target());
  std::string path = target.substr(0, target.find('?'));
  auto params = query_of(target);
  auto second_slash = path.find('/', 1);
  std::string first = path.substr(1, second_slash == std::string::npos ? std::string::npos : second_slash - 1);
  std::string rest = second_slash == std::string::npos ? "" : path.substr(second_slash + 1);

  if (path == "/v1/chat/completions" && req.method() == http::verb::post) {
    if (!s.config.require_key.empty() && req[http::field::authorization] != "Bearer " + s.config.require_key)
      return send_json(socket, req, http::status::unauthorized,
                       openai_error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"));
    return chat_completions(socket, req, s);
  }
  if (path == "/v1/models")
    return send_json(socket, req, http::status::ok,
                     {{"object", "list"},
                      {"data", {{{"id", "mock-model"}, {"object", "model"}, {"owned_by", "cairn"}}}}});
  if (first == "pages") return page(socket, req, s, rest);
  if (first == "echo") {
    json headers = json::object();
    for (const auto& field : req) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      headers[name] = std::string(field.value());
    }
    return send_json(socket, req, http::status::ok,
                     {{"method", std::string(req.method_string())}, {"target", target}, {"headers", headers},
                      {"body", req.body()}});
  }
  if (first == "redirect") {
    long n = number_param(params, "n", -1);
    std::string location = params.count("to") ? params["to"] : n > 0 ? fmt::format("/redirect?n={}", n - 1) : "";
    if (location.empty() && n != 0)
      return send(socket, req, http::status::bad_request, "text/plain", "give ?to=URL or ?n=COUNT\n");
    if (location.empty()) return send(socket, req, http::status::ok, "text/plain", "redirects done\n");
    long code = number_param(params, "status", 302);
    if (code != 301 && code != 302 && code != 303 && code != 307 && code != 308)
      return send(socket, req, http::status::bad_request, "text/plain", "status must be 301-303, 307 or 308\n");
    http::response<http::string_body> res{static_cast<http::status>(code), req.version()};
    res.set(http::field::location, location);
    res.keep_alive(false);
    res.prepare_payload();
    http::write(socket, res);
    return;
  }
  if (first == "status") {
    int code = std::atoi(rest.substr(0, rest.find('/')).c_str());
    if (code < 200 || code > 599) return send(socket, req, http::status::bad_request, "text/plain", "status 200-599\n");
    if (code == 204 || code == 304) return send(socket, req, static_cast<http::status>(code), "text/plain", "");
    return send_json(socket, req, static_cast<http::status>(code),
                     openai_error(fmt::format("mock status {}", code), "mock_status"));
  }
  if (first == "slow") {
    long ms = number_param(params, "ms", 5000);
    if (!s.live.sleep_for(std::chrono::milliseconds(std::max(0L, ms)))) return;
    return send(socket, req, http::status::ok, "text/plain", fmt::format("answered after {} ms\n", ms));
  }
  if (first == "big") return big(socket, req, std::max(0L, number_param(params, "bytes", 1000)));
  if (first == "deep") {
    auto levels = static_cast<std::size_t>(std::max(0L, number_param(params, "levels", 300000)));
    return send(socket, req, http::status::ok, "application/json",
                R"({"choices": [{"message": {"role": "assistant", "content": "deep"}, "finish_reason": "stop"}], )"
                R"("usage": )" + repeat(R"({"d": )", levels) + "0" + std::string(levels, '}') + "}");
  }
  send_json(socket, req, http::status::not_found, openai_error("no route for " + path, "not_found"));
}

void log_request(const request& req, server& s) {
  static std::atomic<std::uint64_t> requests{0};
  json headers = json::object();
  std::string authorization = "absent";
  for (const auto& field : req) {
    if (field.name() == http::field::authorization) {
      authorization = s.config.require_key.empty()                            ? "present"
                      : field.value() == "Bearer " + s.config.require_key ? "matched"
                                                                              : "wrong";
      continue;  // never the key itself
    }
    headers[std::string(field.name_string())] = std::string(field.value());
  }
  json body = json::parse(req.body(), nullptr, false);
  s.log.write({{"request", ++requests},
               {"method", std::string(req.method_string())},
               {"path", std::string(req.target())},
               {"body_hash", fnv1a(req.body())},
               {"headers", headers},
               {"authorization", authorization},
               {"body", body.is_discarded() ? json(req.body()) : body}});
}

// Serves the one request on `fd`, then closes it.
void serve(int fd, server& s) {
  {
    net::io_context context;
    tcp::socket socket(context, tcp::v4(), fd);
    try {
      beast::flat_buffer buffer;
      http::request_parser<http::string_body> parser;
      parser.body_limit(64 << 20);
      http::read(socket, buffer, parser);
      log_request(parser.get(), s);
      respond(socket, parser.get(), s);
      boost::system::error_code ignored;
      socket.shutdown(tcp::socket::shutdown_send, ignored);
    } catch (const std::exception&) {
      // The client went away or sent garbage; nothing to answer.
    }
    s.live.forget(fd);
  }
  s.live.done();
}

void write_port_file(const std::string& path, unsigned short port) {
  std::string temporary = path + ".tmp";
  std::ofstream(temporary) << port << "\n";
  fs::rename(temporary, path);  // readers see the whole number or no file
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairn-mock-llm: a local OpenAI-compatible chat server for demos and tests"};
  unsigned short port = 0;
  std::string port_file, script_file, log_file;
  settings config;
  app.add_option("--port", port, "port on 127.0.0.1 (0: pick a free one)");
  app.add_option("--port-file", port_file, "write the port here once listening");
  app.add_option("--script", script_file,
                 "replies: {\"replies\": [{\"match\": ..., \"content\": ...}], \"default\": ...}; a reply may "
                 "also ask for \"last\" (in the last message) and \"system\" (in the system message), and answer "
                 "\"tool_calls\": [{\"name\": ..., \"arguments\": {...}}]")
      ->check(CLI::ExistingFile);
  app.add_option("--require-key", config.require_key, "answer 401 unless Authorization is \"Bearer KEY\"");
  app.add_option("--summary-bytes", config.summary_bytes,
                 "a reply no script gives is \"Summary: \" and this many bytes of the last user message (default 200)");
  app.add_option("--log", log_file, "append one JSON line per request (never the key)");
  app.add_option("--pages", config.pages_dir, "serve GET /pages/NAME from this folder")->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  if (!script_file.empty()) {
    std::ifstream in(script_file);
    config.script = json::parse(in, nullptr, false);
    const auto& replies = config.script.is_object() ? config.script.value("replies", json::array()) : json();
    auto string_or_absent = [](const json& r, const char* key) { return !r.contains(key) || r[key].is_string(); };
    auto valid_call = [](const json& c) {
      return c.is_object() && c.value("name", json()).is_string() && c.contains("arguments") &&
             (c["arguments"].is_string() || c["arguments"].is_object());
    };
    bool valid = replies.is_array() && std::all_of(replies.begin(), replies.end(), [&](const json& r) {
      const auto& calls = r.is_object() ? r.value("tool_calls", json::array()) : json();
      return r.is_object() && string_or_absent(r, "match") && string_or_absent(r, "last") &&
             string_or_absent(r, "system") && string_or_absent(r, "content") &&
             (r.contains("content") || r.contains("tool_calls")) && calls.is_array() &&
             std::all_of(calls.begin(), calls.end(), valid_call);
    });
    if (!valid) {
      std::cerr << "cairn-mock-llm: " << script_file
                << " must be {\"replies\": [{\"match\": \"...\", \"content\": \"...\"}], \"default\": \"...\"}; "
                   "a reply may add \"last\" and \"system\" strings and answer \"tool_calls\": [{\"name\": \"...\", "
                   "\"arguments\": {...}}] instead of \"content\"\n";
      return 2;
    }
  }
  server s(std::move(config), log_file);

  net::io_context context;
  tcp::acceptor acceptor(context);
  try {
    acceptor = tcp::acceptor(context, tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  } catch (const boost::system::system_error& e) {
    std::cerr << "cairn-mock-llm: cannot listen on 127.0.0.1:" << port << ": " << e.code().message() << "\n";
    return 1;
  }
  port = acceptor.local_endpoint().port();
  if (!port_file.empty()) write_port_file(port_file, port);
  std::cout << "cairn-mock-llm listening on http://127.0.0.1:" << port << std::endl;

  net::signal_set signals(context, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int) { acceptor.close(); });
  std::function<void()> accept = [&] {
    acceptor.async_accept([&](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;  // closed by a signal
      int fd = socket.release();
      s.live.enter(fd);
      try {
        std::thread(serve, fd, std::ref(s)).detach();
      } catch (const std::system_error&) {  // out of threads: drop this connection
        s.live.forget(fd);
        ::close(fd);
        s.live.done();
      }
      accept();
    });
  };
  accept();
  context.run();
  if (!s.live.stop(std::chrono::seconds(5))) {
    std::cerr << "cairn-mock-llm: connections still busy after 5 s; exiting anyway\n";
    std::_Exit(1);
  }
  return 0;
}
