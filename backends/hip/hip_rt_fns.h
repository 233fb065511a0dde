/* The HIP runtime functions the HIP backend and the RCCL collective call, as an X-macro list:
 * X(Name) stands for hipName. Every one must be in libamdhip64 (the runtime is refused
 * otherwise, naming the first missing one). Free of HIP headers, so that the fake runtime of
 * the tests (fake/fake_hip.c) can export the same names. The optional ones, and those whose name
 * changed between ROCm releases, are members of their own in hip_rt.h. */
#ifndef SHARDLOAD_HIP_RT_FNS_H
#define SHARDLOAD_HIP_RT_FNS_H

#define SL_HIP_FUNCTIONS(X)                                                                           \
  X(GetErrorName) X(GetErrorString) X(GetLastError) X(DriverGetVersion) X(RuntimeGetVersion)         \
  X(GetDeviceCount) X(GetDevice) X(SetDevice) X(GetDeviceProperties) X(DeviceGetPCIBusId)            \
  X(StreamCreateWithFlags) X(StreamDestroy) X(StreamQuery) X(StreamSynchronize) X(StreamWaitEvent)   \
  X(StreamIsCapturing)                                                                              \
  X(EventCreateWithFlags) X(EventDestroy) X(EventRecord) X(EventQuery)                              \
  X(MemPoolCreate) X(MemPoolDestroy) X(MemPoolSetAttribute) X(MemPoolTrimTo)                        \
  X(MallocFromPoolAsync) X(MallocAsync) X(FreeAsync) X(HostRegister) X(HostUnregister)              \
  X(PointerGetAttributes) X(MemGetAddressRange) X(MemcpyAsync) X(Memcpy2DAsync) X(LaunchKernel)

/* The compiler's launch ABI: what clang emits for the registration of a file's kernels and for
 * a <<<>>> launch (with hipLaunchKernel above). X(Name) stands for __hipName; hip_launch.c
 * defines each in the module and forwards it to the runtime's. */
#define SL_HIP_LAUNCH_FUNCTIONS(X) \
  X(RegisterFatBinary) X(RegisterFunction) X(UnregisterFatBinary) X(PushCallConfiguration) X(PopCallConfiguration)

#endif
