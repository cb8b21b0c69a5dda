# `make deb`: cairn as a Debian package (CPack's DEB generator), built from
# a build configured with CMAKE_INSTALL_PREFIX=/usr. Its Depends are the
# shared libraries dpkg-shlibdeps finds in its programs, and what cairn runs:
# bwrap, mkfs.ext4 and debugfs (a workspace's quota image), fuse2fs (that
# image for a normal user); libpq is loaded only for a PostgreSQL journal.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cairn)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "cairn maintainers <maintainers@cairn.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "durable, sandboxed workflows for AI agents")
set(CPACK_PACKAGE_DESCRIPTION "cairn runs a multi-step AI agent inside a sandbox (bubblewrap,
seccomp, resource limits, no network) and checkpoints every step to a
journal on the host, so that after any crash the run resumes where it
stopped. Tools that need a credential, HTTP requests and model calls cross
the boundary as messages the host checks against the run's policy. Agents
in C++, Python and TypeScript.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # cairn_VERSION_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "bubblewrap, e2fsprogs, fuse2fs, adduser")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, libpq5, systemd")
# nodejs runs JavaScript agents (the SDK runs on Debian 12's Node 18) but
# only those: with libnode108 and libicu72 it adds about 88 MB installed, so
# it is suggested, not recommended.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "nodejs, postgresql")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CAIRN_ROOT}/packaging/debian/postinst ${CAIRN_ROOT}/packaging/debian/prerm
    ${CAIRN_ROOT}/packaging/debian/postrm ${CAIRN_ROOT}/packaging/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
include(CPack)
