// The empty ext4 filesystem a new workspace image starts as. Made once per
// folder, size and owner with mkfs.ext4 into a hidden file beside the
// images (lost+found dropped with debugfs when it is installed), then
// copied for each new image: a reflink where the filesystem has them, else
// only the template's data extents, so the copy keeps its holes (a few
// hundred KiB on disk) and a new image costs no mkfs.ext4. The copies share
// the template's UUID, which ext4 does not mind. Internal to runtime/.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace cairn::runtime {

struct ext4_tools {
  std::filesystem::path mkfs;     // mkfs.ext4
  std::filesystem::path debugfs;  // empty: the template keeps its lost+found
};

// The template for images of `bytes` owned by uid:gid in `folder`.
std::filesystem::path workspace_template_path(const std::filesystem::path& folder, std::uint64_t bytes, uid_t uid,
                                              gid_t gid);

// Makes `image` (absent) a copy of its template, the template first when
// missing; its root is owned by uid:gid. Takes one of the copies made ahead
// (make_workspace_images_ahead) when there is one, renamed into place, else
// writes `<image>.new`, fsynced and renamed: an image that exists is a
// whole filesystem. Throws sandbox_error(workspace_failed) naming the step.
void make_workspace_image(const ext4_tools& tools, const std::filesystem::path& image, std::uint64_t bytes,
                          uid_t uid, gid_t gid);

// Has a background thread keep images_made_ahead copies of the template of
// `bytes` and uid:gid in `folder`, each written under no name and linked
// once whole and synced, for the next make_workspace_image there. Called
// once a new image is mounted: their writes would hold up that mount.
void make_workspace_images_ahead(const std::filesystem::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid);
inline constexpr std::size_t images_made_ahead = 2;

// The template for images of `bytes` owned by uid:gid in `folder` made a
// broken image: deletes it and the copies made ahead of it.
void forget_workspace_template(const std::filesystem::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid);

}  // namespace cairn::runtime
