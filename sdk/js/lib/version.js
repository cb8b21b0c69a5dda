// This SDK's version: cairn's (the CMake project's), which package.json also
// says; the test versions_agree (tests/CMakeLists.txt) holds them equal.
export const version = "0.1.0";
