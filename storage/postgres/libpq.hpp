// libpq in storage/postgres/'s terms (internal): results and their rows as
// records.hpp reads rows, statement parameters, a failed call before it
// becomes a storage_error, and opening a connection.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace cairn::storage::postgres {

// A failed libpq call or statement, before it becomes a storage_error.
struct pg_failure : std::runtime_error {
  pg_failure(std::string message, std::string sqlstate, bool lost, bool ambiguous, bool repeatable)
      : std::runtime_error(std::move(message)),
        sqlstate(std::move(sqlstate)),
        lost(lost),
        ambiguous(ambiguous),
        repeatable(repeatable) {}
  std::string sqlstate;  // "" when the server sent none
  bool lost;             // the connection is gone
  bool ambiguous;        // lost while a commit was under way: it may or may not have happened
  bool repeatable;       // lost before anything was written: the call may run again
};

struct result {
  std::unique_ptr<PGresult, decltype(&PQclear)> r{nullptr, &PQclear};
  int rows() const { return PQntuples(r.get()); }
  std::int64_t affected() const {
    const char* n = PQcmdTuples(r.get());
    return *n ? std::stoll(n) : 0;
  }
};

// Row `row` of a result, as records.hpp reads rows.
struct pg_row {
  const result& res;
  int row = 0;
  bool null(int i) const { return PQgetisnull(res.r.get(), row, i) == 1; }
  std::string text(int i) const {
    return {PQgetvalue(res.r.get(), row, i), static_cast<std::size_t>(PQgetlength(res.r.get(), row, i))};
  }
  std::int64_t int64(int i) const { return std::stoll(PQgetvalue(res.r.get(), row, i)); }
};

// A BYTEA parameter: sent in binary, so its bytes go as they are.
struct bytes {
  const std::string& data;
};

// One statement parameter in libpq's terms; nullopt is NULL.
struct param {
  std::optional<std::string> value;
  bool binary = false;
};
inline param to_param(std::string_view v) { return {std::string(v)}; }
inline param to_param(const std::string& v) { return {v}; }
inline param to_param(const char* v) { return {std::string(v)}; }
inline param to_param(std::int64_t v) { return {std::to_string(v)}; }
inline param to_param(int v) { return {std::to_string(v)}; }
inline param to_param(const bytes& v) { return {v.data, true}; }
template <class T>
param to_param(const std::optional<T>& v) {
  if (!v) return {};
  return to_param(*v);
}

// BYTEA in PostgreSQL's text output ("\x" and two hex digits a byte).
inline std::string from_hex_bytea(std::string_view text) {
  auto digit = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::string out;
  if (text.substr(0, 2) != "\\x") return std::string(text);
  for (std::size_t i = 2; i + 1 < text.size(); i += 2)
    out.push_back(static_cast<char>(digit(text[i]) * 16 + digit(text[i + 1])));
  return out;
}

// libpq's messages end in a newline and go on over lines of their own
// ("...failed: No such file or directory\n\tIs the server running..."):
// one line, their parts a space apart, rather than escapes on a terminal.
inline std::string trimmed(const std::string& s) {
  std::string line;
  for (const char c : s) {
    if (c != '\n' && c != '\t') line += c;
    else if (!line.empty() && line.back() != ' ') line += ' ';
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

// libpq's connection to `url`, with defaults the URL may override: a server
// that does not answer fails the call in 10 s instead of never, and the
// server's views name the client. The server's notices (a WARNING as it
// shuts down) are not printed: what matters reaches the caller as an error.
inline PGconn* connect_to(const std::string& url) {
  const char* keywords[] = {"connect_timeout", "application_name", "dbname", nullptr};
  const char* values[] = {"10", "cairn", url.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keywords, values, 1);
  if (conn) PQsetNoticeProcessor(conn, [](void*, const char*) {}, nullptr);
  return conn;
}

inline bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A statement that writes nothing: lost before its answer, it may run again.
inline bool writes_nothing(std::string_view sql) { return starts_with(sql, "SELECT") || starts_with(sql, "BEGIN"); }


}  // namespace cairn::storage::postgres
