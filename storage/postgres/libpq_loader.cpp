// libpq, loaded when a program first calls it (opens a PostgreSQL journal)
// rather than by the dynamic loader at every start of every program that
// links storage. libpq brings Kerberos, LDAP, SASL and GnuTLS with it: ~20
// shared objects and ~10 ms of CPU per start on a paravirtualized machine
// (bench: an empty program linking libpq against one that does not), which
// every `cairn` command paid, SQLite journal or not.
//
// Each libpq function cairn calls is defined here with libpq-fe.h's own
// declaration (a mismatch does not compile) and forwards to libpq's, found
// with dlsym in libpq.so.5 on first use. Nothing links libpq itself. When
// libpq cannot be loaded, the first call throws storage_error(io) naming
// the package to install.
#include <dlfcn.h>
#include <libpq-fe.h>

#include <fmt/format.h>

#include "storage/journal.hpp"

namespace {

using cairn::storage::errc;
using cairn::storage::storage_error;

constexpr const char* soname = "libpq.so.5";

void* library() {
  static void* const handle = [] {
    void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h)
      throw storage_error(errc::io, fmt::format("a PostgreSQL journal needs libpq, which could not be loaded ({}); "
                                                "install it (apt-get install libpq5)",
                                                ::dlerror()));
    return h;
  }();
  return handle;
}

// libpq's `name`, typed as our declaration of it (`ours`, which is libpq-fe.h's).
template <class F>
F* resolve(F* /*ours*/, const char* name) {
  void* found = ::dlsym(library(), name);
  if (!found)
    throw storage_error(errc::io, fmt::format("{} has no {}: cairn needs the libpq of PostgreSQL 14 or later "
                                              "(apt-get install libpq5)",
                                              soname, name));
  return reinterpret_cast<F*>(found);
}

}  // namespace

extern "C" {

PGconn* PQconnectdb(const char* conninfo) {
  static auto* const real = resolve(PQconnectdb, "PQconnectdb");
  return real(conninfo);
}
PGconn* PQconnectdbParams(const char* const* keywords, const char* const* values, int expand_dbname) {
  static auto* const real = resolve(PQconnectdbParams, "PQconnectdbParams");
  return real(keywords, values, expand_dbname);
}
PGPing PQping(const char* conninfo) {
  static auto* const real = resolve(PQping, "PQping");
  return real(conninfo);
}
void PQfinish(PGconn* conn) {
  static auto* const real = resolve(PQfinish, "PQfinish");
  real(conn);
}
void PQreset(PGconn* conn) {
  static auto* const real = resolve(PQreset, "PQreset");
  real(conn);
}
ConnStatusType PQstatus(const PGconn* conn) {
  static auto* const real = resolve(PQstatus, "PQstatus");
  return real(conn);
}
PGTransactionStatusType PQtransactionStatus(const PGconn* conn) {
  static auto* const real = resolve(PQtransactionStatus, "PQtransactionStatus");
  return real(conn);
}
char* PQerrorMessage(const PGconn* conn) {
  static auto* const real = resolve(PQerrorMessage, "PQerrorMessage");
  return real(conn);
}
const char* PQparameterStatus(const PGconn* conn, const char* paramName) {
  static auto* const real = resolve(PQparameterStatus, "PQparameterStatus");
  return real(conn, paramName);
}
char* PQuser(const PGconn* conn) {
  static auto* const real = resolve(PQuser, "PQuser");
  return real(conn);
}
char* PQhost(const PGconn* conn) {
  static auto* const real = resolve(PQhost, "PQhost");
  return real(conn);
}
char* PQport(const PGconn* conn) {
  static auto* const real = resolve(PQport, "PQport");
  return real(conn);
}
int PQsocket(const PGconn* conn) {
  static auto* const real = resolve(PQsocket, "PQsocket");
  return real(conn);
}
PQnoticeProcessor PQsetNoticeProcessor(PGconn* conn, PQnoticeProcessor proc, void* arg) {
  static auto* const real = resolve(PQsetNoticeProcessor, "PQsetNoticeProcessor");
  return real(conn, proc, arg);
}
int PQsetnonblocking(PGconn* conn, int arg) {
  static auto* const real = resolve(PQsetnonblocking, "PQsetnonblocking");
  return real(conn, arg);
}
PGresult* PQexec(PGconn* conn, const char* query) {
  static auto* const real = resolve(PQexec, "PQexec");
  return real(conn, query);
}
PGresult* PQprepare(PGconn* conn, const char* stmtName, const char* query, int nParams, const Oid* paramTypes) {
  static auto* const real = resolve(PQprepare, "PQprepare");
  return real(conn, stmtName, query, nParams, paramTypes);
}
PGresult* PQexecPrepared(PGconn* conn, const char* stmtName, int nParams, const char* const* paramValues,
                         const int* paramLengths, const int* paramFormats, int resultFormat) {
  static auto* const real = resolve(PQexecPrepared, "PQexecPrepared");
  return real(conn, stmtName, nParams, paramValues, paramLengths, paramFormats, resultFormat);
}
int PQsendQueryParams(PGconn* conn, const char* command, int nParams, const Oid* paramTypes,
                      const char* const* paramValues, const int* paramLengths, const int* paramFormats,
                      int resultFormat) {
  static auto* const real = resolve(PQsendQueryParams, "PQsendQueryParams");
  return real(conn, command, nParams, paramTypes, paramValues, paramLengths, paramFormats, resultFormat);
}
int PQsendQueryPrepared(PGconn* conn, const char* stmtName, int nParams, const char* const* paramValues,
                        const int* paramLengths, const int* paramFormats, int resultFormat) {
  static auto* const real = resolve(PQsendQueryPrepared, "PQsendQueryPrepared");
  return real(conn, stmtName, nParams, paramValues, paramLengths, paramFormats, resultFormat);
}
int PQenterPipelineMode(PGconn* conn) {
  static auto* const real = resolve(PQenterPipelineMode, "PQenterPipelineMode");
  return real(conn);
}
int PQexitPipelineMode(PGconn* conn) {
  static auto* const real = resolve(PQexitPipelineMode, "PQexitPipelineMode");
  return real(conn);
}
int PQpipelineSync(PGconn* conn) {
  static auto* const real = resolve(PQpipelineSync, "PQpipelineSync");
  return real(conn);
}
int PQconsumeInput(PGconn* conn) {
  static auto* const real = resolve(PQconsumeInput, "PQconsumeInput");
  return real(conn);
}
PGresult* PQgetResult(PGconn* conn) {
  static auto* const real = resolve(PQgetResult, "PQgetResult");
  return real(conn);
}
PGnotify* PQnotifies(PGconn* conn) {
  static auto* const real = resolve(PQnotifies, "PQnotifies");
  return real(conn);
}
void PQclear(PGresult* res) {
  static auto* const real = resolve(PQclear, "PQclear");
  real(res);
}
void PQfreemem(void* ptr) {
  static auto* const real = resolve(PQfreemem, "PQfreemem");
  real(ptr);
}
ExecStatusType PQresultStatus(const PGresult* res) {
  static auto* const real = resolve(PQresultStatus, "PQresultStatus");
  return real(res);
}
char* PQresultErrorMessage(const PGresult* res) {
  static auto* const real = resolve(PQresultErrorMessage, "PQresultErrorMessage");
  return real(res);
}
char* PQresultErrorField(const PGresult* res, int fieldcode) {
  static auto* const real = resolve(PQresultErrorField, "PQresultErrorField");
  return real(res, fieldcode);
}
int PQntuples(const PGresult* res) {
  static auto* const real = resolve(PQntuples, "PQntuples");
  return real(res);
}
char* PQgetvalue(const PGresult* res, int tup_num, int field_num) {
  static auto* const real = resolve(PQgetvalue, "PQgetvalue");
  return real(res, tup_num, field_num);
}
int PQgetlength(const PGresult* res, int tup_num, int field_num) {
  static auto* const real = resolve(PQgetlength, "PQgetlength");
  return real(res, tup_num, field_num);
}
int PQgetisnull(const PGresult* res, int tup_num, int field_num) {
  static auto* const real = resolve(PQgetisnull, "PQgetisnull");
  return real(res, tup_num, field_num);
}
char* PQcmdTuples(PGresult* res) {
  static auto* const real = resolve(PQcmdTuples, "PQcmdTuples");
  return real(res);
}

}  // extern "C"
