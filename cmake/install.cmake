# `cmake --install`: the ringtrain binary and launch/ringrun, the libraries an op is written against (rt_base,
# rt_kernels, the model schema, rt_nn) with their headers under include/ringtrain, the
# shipped model files and the schema under share/ringtrain, and the CMake package
# (lib/cmake/ringtrain) that gives find_package(ringtrain 0.1) its imported targets:
#   ringtrain::plugin     what a --plugin library compiles against: headers, C++20, the
#                         protobuf headers; nothing linked (the binary provides the symbols)
#   ringtrain::nn         the model math, linked whole (its ops register themselves), with
#                         ringtrain::kernels, ringtrain::base, ringtrain::model_proto: for a
#                         program of one's own (an op's unit test)
#   ringtrain::ringtrain  the installed binary
# comm, io, train and launch are not installed: a program that trains uses the ringtrain binary
# (with --plugin), not a main of its own (docs/models.md, "Extending in C++").
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# A plugin: headers only. Its undefined references (register_op, Layer, Tensor, ...) are
# resolved at dlopen() against the running binary, which exports them (ENABLE_EXPORTS).
add_library(rt_plugin_api INTERFACE)
# Not rt_model_proto: a second copy of the schema's descriptors in one process is a protobuf
# fatal error. libprotobuf itself is a shared library, loaded once.
target_link_libraries(rt_plugin_api INTERFACE rt_flags protobuf::libprotobuf)
target_include_directories(rt_plugin_api INTERFACE
  $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated/proto>)

set_target_properties(rt_flags PROPERTIES EXPORT_NAME flags)
set_target_properties(rt_base PROPERTIES EXPORT_NAME base)
set_target_properties(rt_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(rt_model_proto PROPERTIES EXPORT_NAME model_proto)
set_target_properties(rt_nn PROPERTIES EXPORT_NAME nn_archive)
set_target_properties(rt_nn_all PROPERTIES EXPORT_NAME nn)
set_target_properties(rt_plugin_api PROPERTIES EXPORT_NAME plugin)

install(TARGETS ringtrain EXPORT ringtrainTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The launcher wrapper beside the binary, where slurm/train.sbatch looks for it first.
install(PROGRAMS launch/ringrun DESTINATION ${CMAKE_INSTALL_BINDIR})
# The SentencePiece module, where io/tokenizer.cpp looks from an installed binary.
install(TARGETS rt_sentencepiece LIBRARY DESTINATION lib/ringtrain)
install(TARGETS rt_flags rt_base rt_kernels rt_model_proto rt_nn rt_nn_all rt_plugin_api
        EXPORT ringtrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The headers of an op: the vocabulary (core), the backend interface (kernels.hpp), the
# model math (nn) and the generated config.hpp and model.pb.h, at the paths sources use.
set(rt_inc ${CMAKE_INSTALL_INCLUDEDIR}/ringtrain)
install(DIRECTORY core/ DESTINATION ${rt_inc}/core FILES_MATCHING PATTERN "*.hpp")
install(FILES kernels/kernels.hpp kernels/kernel_table.hpp kernels/forwarding_backend.hpp DESTINATION ${rt_inc}/kernels)
install(DIRECTORY nn/ DESTINATION ${rt_inc}/nn FILES_MATCHING PATTERN "*.hpp"
        PATTERN ops EXCLUDE PATTERN graph_expand.hpp EXCLUDE)  # (internal to nn/)
install(FILES ${CMAKE_BINARY_DIR}/generated/ringtrain/config.hpp
              ${CMAKE_BINARY_DIR}/generated/proto/ringtrain/model.pb.h
        DESTINATION ${rt_inc}/ringtrain)
# The shipped model files (also compiled into the binary, which therefore needs no path to
# them) and the schema, to read and to start one's own from.
install(FILES ${RT_MODEL_FILES} DESTINATION ${CMAKE_INSTALL_DATADIR}/ringtrain/models)
install(FILES proto/ringtrain/model.proto DESTINATION ${CMAKE_INSTALL_DATADIR}/ringtrain/proto)

set(rt_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ringtrain)
install(EXPORT ringtrainTargets NAMESPACE ringtrain:: DESTINATION ${rt_cmake_dir})
configure_package_config_file(cmake/ringtrainConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ringtrainConfig.cmake INSTALL_DESTINATION ${rt_cmake_dir}
  PATH_VARS CMAKE_INSTALL_DATADIR)
# 0.x: a minor version may change the ABI a plugin depends on.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ringtrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ringtrainConfig.cmake
              ${CMAKE_BINARY_DIR}/ringtrainConfigVersion.cmake DESTINATION ${rt_cmake_dir})
