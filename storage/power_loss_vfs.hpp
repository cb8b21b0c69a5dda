// A test seam, linked only into test binaries (never into the installed
// cairn): a SQLite VFS that wraps the default one and simulates a power cut,
// as SQLite's own crash tests do.
//
// Model. For every file SQLite opens as a database, journal or WAL, the VFS
// keeps in `images` the file's durable image: the content it had at its last
// completed xSync. A write is durable only once a sync of that file returns;
// a file that did not exist when opened has a durable directory entry only
// once SQLite's unix VFS would have synced its folder (the first sync of a
// WAL or rollback journal; never for a database file SQLite created); a
// delete is durable only when SQLite asks for the folder sync. Real fsyncs
// are skipped: the images are the durable state, so the simulation is fast.
// The -shm file is never durable (SQLite rebuilds it from the WAL).
//
// A cut is two halves in two processes: the process using the VFS dies
// (SIGKILL, at any instant, even inside a sync: a sync cut short leaves any
// subset of its writes durable, as a disk would), then another process calls
// cut_power(), which puts every file back to its durable image.
#pragma once

#include <filesystem>
#include <random>

namespace cairn::storage::testing {

// Makes the power-loss VFS SQLite's default in this process; call before the
// first journal is opened. `images` is a folder of its own (created if
// missing), kept between processes: a later process takes the files as they
// are then as durable.
void install_power_loss_vfs(const std::filesystem::path& images);

// After the process that used the VFS on `images` died: replaces each file it
// opened by its durable image, deletes those whose directory entry never
// became durable, and deletes the -shm files. With `tear`, each 512-byte
// sector written since the last sync survives or not at random (as a disk
// that got some of them down), drawn from `*tear`.
void cut_power(const std::filesystem::path& images, std::mt19937_64* tear = nullptr);

}  // namespace cairn::storage::testing
