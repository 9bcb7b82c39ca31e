# Third-party libraries, all from Debian packages (scripts/install-deps.sh installs them).
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(prometheus-cpp REQUIRED COMPONENTS core pull)
find_package(cpprestsdk REQUIRED)
find_package(OpenSSL REQUIRED)
# libcurl 7.88 (libcurl4-openssl-dev): S3 requests for backups, signed with its own SigV4
# (CURLOPT_AWS_SIGV4, 7.75) and CURLOPT_PROTOCOLS_STR (7.85).
find_package(CURL 7.85 REQUIRED)
find_package(GTest REQUIRED)
find_package(zstd REQUIRED)
# simdjson 3.0 (libsimdjson-dev): the JSONEachRow reader's structural scan (row_format.cpp).
find_package(simdjson REQUIRED)
find_package(Java 17 REQUIRED COMPONENTS Development)
include(UseJava)

# libzookeeper-mt ships no CMake or pkg-config file. THREADED enables the synchronous API.
find_library(ZOOKEEPER_MT_LIBRARY zookeeper_mt REQUIRED)
find_path(ZOOKEEPER_INCLUDE_DIR zookeeper/zookeeper.h REQUIRED)
add_library(ZooKeeper::zookeeper_mt UNKNOWN IMPORTED)
set_target_properties(ZooKeeper::zookeeper_mt PROPERTIES
  IMPORTED_LOCATION "${ZOOKEEPER_MT_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${ZOOKEEPER_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS THREADED)

# xxHash (XXH3-128 for part checksums, dedup ids and partition ids) ships no CMake file either.
find_library(XXHASH_LIBRARY xxhash REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
add_library(xxHash::xxhash UNKNOWN IMPORTED)
set_target_properties(xxHash::xxhash PROPERTIES
  IMPORTED_LOCATION "${XXHASH_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")

# cpprestsdk: its `U` macro breaks fmt, spdlog and GoogleTest headers, and its target does not
# pull OpenSSL in. Link rtable::cpprest instead of cpprestsdk::cpprest.
add_library(rtable_cpprest INTERFACE)
add_library(rtable::cpprest ALIAS rtable_cpprest)
target_link_libraries(rtable_cpprest INTERFACE cpprestsdk::cpprest OpenSSL::SSL OpenSSL::Crypto)
target_compile_definitions(rtable_cpprest INTERFACE _TURN_OFF_PLATFORM_STRING)

# ZooKeeper's own jars, for the local server and the snapshot tool.
set(RTABLE_ZOOKEEPER_JAR /usr/share/java/zookeeper.jar CACHE FILEPATH "ZooKeeper server jar")
set(RTABLE_ZOOKEEPER_JUTE_JAR /usr/share/java/zookeeper-jute.jar CACHE FILEPATH "ZooKeeper jute jar")
