// cuda_emulator.h: enough of CUDA for the host C++ compiler to build our .cu sources unchanged
// and run them on the CPU, one real std::thread per CUDA thread.
//
// Holds: the qualifiers (__global__, __device__, __forceinline__, __shared__ ...), dim3 and the
// built-in variables threadIdx / blockIdx / blockDim / gridDim as thread-local state,
// __syncthreads as a barrier over the threads of the block, the warp shuffles
// (__shfl_sync, __shfl_xor_sync, __shfl_up_sync, __shfl_down_sync) exchanged among the 32
// lanes of a warp, __int_as_float / __float_as_int, float2 / float4 and their make_ functions,
// min / max and the float math functions, and emu::launch, which runs a grid block after block.
//
// What a GPU enforces, this enforces too, and says so (emu::Error, reported to Python): more
// than 1024 threads per block, more dynamic shared memory than the launch allows, a
// __syncthreads that some threads of the block never reach (they returned, or wait at another
// __syncthreads), a shuffle that names a lane which has returned or does not exist. Shared
// memory starts each block filled with NaN, not zeros, so a read before a write shows up in
// the results. The debug build (-fsanitize=address) poisons the bytes past the launch's
// dynamic shared memory, so an out-of-bounds shared index stops with AddressSanitizer's report.
//
// The counting build (-DEMU_COUNT, with -fsanitize=thread instrumentation but not its runtime)
// counts, per launch and summed over threads: fmaf calls, mma instructions (per lane, as a GPU
// counts an instruction each lane executes), __syncthreads, shuffles, and every
// load and store the compiler emits, by memory space. The instrumentation calls __tsan_readN /
// __tsan_writeN before each access; the definitions below (not TSan's) classify the address:
// the block's shared buffer is shared memory, the ranges of the kernel's array arguments are
// global memory, anything else (the thread's stack, which holds a GPU's registers, and the
// emulator's own state) is not counted. An N-byte access is one instruction of N / 4 elements,
// so a float4 load is one instruction, four elements.
//
// Leaves out on purpose: speed (this checks the algorithm, not the timing), static __shared__
// arrays (the Python builder refuses them: only `extern __shared__` is emulated), atomics,
// warp votes, partial shuffle masks and widths below 32 (refused), cooperative groups,
// streams. Blocks run one after another (a legal schedule: CUDA promises no order between
// blocks), which is also why one buffer serves as every block's shared memory.
//
// Follows the CUDA C++ Programming Guide: "Built-in Variables", "Synchronization Functions"
// and "Warp Shuffle Functions".
#pragma once

#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <math.h>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
// Only `extern __shared__ T name[];` is emulated: the declaration then names a global buffer
// that the Python builder defines (see emulator.py), and blocks run one at a time.
#define __shared__

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

// The built-in variables: each emulated thread sets its own copy before it runs the kernel.
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// CUDA's integer min and max are plain functions (not std::min, which wants equal types).
template <class A, class B>
__forceinline__ auto min(A a, B b) -> std::common_type_t<A, B> {
    return b < a ? b : a;
}
template <class A, class B>
__forceinline__ auto max(A a, B b) -> std::common_type_t<A, B> {
    return a < b ? b : a;
}

// CUDA's vector types, with its alignment (a float4 load is one 16-byte access).
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
__forceinline__ float2 make_float2(float x, float y) { return {x, y}; }
__forceinline__ float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

__forceinline__ float __int_as_float(int x) { return std::bit_cast<float>(x); }
__forceinline__ int __float_as_int(float x) { return std::bit_cast<int>(x); }
__forceinline__ float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
__forceinline__ unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }

namespace emu {

constexpr int kWarp = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
// How long a barrier waits before it calls the block deadlocked. Generous: between two
// barriers a thread does at most a few tiles of arithmetic, milliseconds even on a busy CPU.
constexpr std::chrono::seconds kPatience{60};

// A violation of CUDA's rules, found while a block runs; the launch reports its message.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Thrown into the threads still waiting when another thread of the block has failed, so the
// whole block unwinds; never reported itself.
struct Abort {};

// A barrier for a fixed set of threads that notices the ones that will never arrive.
// `arrive` blocks until every live participant has arrived at the same call site. A thread
// that returns from the kernel calls `leave`: if others are waiting, or wait later, the
// barrier fails with an Error that names the call site, instead of hanging as a GPU would.
class Barrier {
   public:
    explicit Barrier(int n) : live_(n) {}

    void arrive(const char* what, int line) {
        std::unique_lock lock(mutex_);
        check_failed();
        if (left_ > 0) fail(lock, missing(what, line));
        if (waiting_ == 0) {
            line_ = line;
        } else if (line != line_) {
            fail(lock, std::string(what) + " on line " + std::to_string(line) +
                           " and on line " + std::to_string(line_) +
                           " wait at the same time: threads of one block took different "
                           "branches around a " + what);
        }
        if (++waiting_ == live_) {
            waiting_ = 0;
            ++generation_;
            lock.unlock();  // waking the waiters while holding their mutex makes them queue on it
            cv_.notify_all();
            return;
        }
        const unsigned long generation = generation_;
        if (!cv_.wait_for(lock, kPatience, [&] { return generation_ != generation || failed_; }))
            fail(lock, std::string(what) + " on line " + std::to_string(line) + " waited " +
                           std::to_string(kPatience.count()) + " s for " +
                           std::to_string(live_ - waiting_) + " threads that are stuck "
                           "elsewhere (at a shuffle or a __syncthreads some threads skip)");
        check_failed();
    }

    void leave(const char* what) {
        std::unique_lock lock(mutex_);
        --live_;
        ++left_;
        if (waiting_ > 0 && !failed_) fail(lock, missing(what, line_));
    }

    // Wake every waiter with Abort: another thread of the block has failed.
    void abort() {
        std::lock_guard lock(mutex_);
        failed_ = true;
        cv_.notify_all();
    }

   private:
    static std::string missing(const char* what, int line) {
        return std::string(what) + " on line " + std::to_string(line) +
               ": some threads wait there while others returned without reaching it; every "
               "thread of the block (of the warp, for a shuffle) must reach it, so keep it out "
               "of code that some threads skip";
    }
    [[noreturn]] void fail(std::unique_lock<std::mutex>& lock, const std::string& message) {
        failed_ = true;
        cv_.notify_all();
        lock.unlock();
        throw Error(message);
    }
    void check_failed() const {
        if (failed_) throw Abort{};
    }

    std::mutex mutex_;
    std::condition_variable cv_;
    int live_;
    int left_ = 0;
    int waiting_ = 0;
    int line_ = 0;
    unsigned long generation_ = 0;
    bool failed_ = false;
};

// One warp: a barrier over its lanes and two exchange slots per lane. Shuffles alternate
// between the two slot sets, so one barrier per shuffle suffices: a lane can only write a
// set again after passing the next barrier, which every lane reaches after its read.
struct Warp {
    explicit Warp(int lanes) : lanes(lanes), barrier(lanes) {}
    int lanes;
    Barrier barrier;
    uint64_t slots[2][kWarp] = {};
    uint32_t fragments[2][kWarp][6] = {};  // an mma's A (4 words) and B (2) operands per lane
};

// What the threads of the running block share.
struct Block {
    Block(int n_threads) : barrier(n_threads) {
        for (int first = 0; first < n_threads; first += kWarp)
            warps.emplace_back(std::make_unique<Warp>(std::min(kWarp, n_threads - first)));
    }
    void abort() {
        barrier.abort();
        for (auto& warp : warps) warp->barrier.abort();
    }
    Barrier barrier;
    std::vector<std::unique_ptr<Warp>> warps;
    std::mutex error_mutex;
    std::string error;  // the first Error of the block, if any
};

inline thread_local Block* current_block = nullptr;
inline thread_local int current_parity = 0;  // which slot set this thread's next shuffle uses

inline int linear_thread() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// ---- Counting (the EMU_COUNT build). Each thread counts into its own Counts while it runs the
// kernel's body; run_thread adds them to the launch's total at the end.
enum Count {
    kFma,
    kSharedLoads, kSharedLoadElements, kSharedStores, kSharedStoreElements,
    kGlobalLoads, kGlobalLoadElements, kGlobalStores, kGlobalStoreElements,
    kBarriers, kShuffles, kMma, kNumCounts
};  // the order of the fields of emulator.Counts
struct Counts {
    unsigned long long n[kNumCounts] = {};
};
inline thread_local Counts* thread_counts = nullptr;  // null outside a kernel's body

#ifdef EMU_COUNT
struct Range {
    std::uintptr_t begin, end;
};
// The array arguments of the launch, set by Python. Plain arrays, not std::vector: the hooks
// must call no instrumented code (it would call the hooks again).
constexpr int kMaxRanges = 64;
inline Range global_ranges[kMaxRanges];
inline int n_global_ranges = 0;
inline Range shared_range;                // the block's dynamic shared memory
inline Counts launch_counts;
inline std::mutex counts_mutex;

__attribute__((no_sanitize_thread)) inline void count(Count what) {
    if (thread_counts) ++thread_counts->n[what];
}
// One access of `bytes` at `address`: is it shared, global or neither?
__attribute__((no_sanitize_thread)) inline void count_access(const void* address,
                                                             std::size_t bytes, bool store) {
    if (!thread_counts) return;
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    int first;
    if (a >= shared_range.begin && a < shared_range.end) {
        first = store ? kSharedStores : kSharedLoads;
    } else {
        first = -1;
        for (int i = 0; i < n_global_ranges; ++i)
            if (a >= global_ranges[i].begin && a < global_ranges[i].end)
                first = store ? kGlobalStores : kGlobalLoads;
        if (first < 0) return;
    }
    ++thread_counts->n[first];
    thread_counts->n[first + 1] += (bytes + 3) / 4;  // elements: 4-byte words
}
#else
inline void count(Count) {}
#endif

inline void syncthreads(int line) {
    count(kBarriers);
    current_block->barrier.arrive("__syncthreads", line);
}

// Every lane posts its value, waits for the warp, then reads lane `src`'s value.
template <class T>
T shuffle(unsigned mask, T value, int src_lane, int line) {
    static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
    count(kShuffles);
    const int tid = linear_thread();
    Warp& warp = *current_block->warps[tid / kWarp];
    const int lane = tid % kWarp;
    if (mask != 0xffffffffu)
        throw Error("shuffle on line " + std::to_string(line) + " with mask " +
                    std::to_string(mask) + ": the emulator supports full-warp masks only");
    if (src_lane < 0 || src_lane >= kWarp) src_lane = lane;  // out of range: own value
    if (src_lane >= warp.lanes)
        throw Error("shuffle on line " + std::to_string(line) + " reads lane " +
                    std::to_string(src_lane) + ", but this warp has only " +
                    std::to_string(warp.lanes) + " threads (the block size is not a multiple of 32)");
    const int parity = current_parity;
    current_parity ^= 1;
    std::memcpy(&warp.slots[parity][lane], &value, sizeof(T));
    warp.barrier.arrive("shuffle", line);
    T out;
    std::memcpy(&out, &warp.slots[parity][src_lane], sizeof(T));
    return out;
}

// ---- Tensor cores: TF32 (PTX ISA, "Floating point data types" and "Matrix multiply-accumulate
// operation using mma instruction", shape m16n8k8 with .tf32 operands).

// cvt.rna.tf32.f32: round x to TF32 (8 exponent bits, 10 stored significand bits) to the
// nearest, ties away from zero; the 13 low bits of the result are zero. Infinities and NaN
// stay as they are. Adding half of the last kept bit to the magnitude and truncating is
// round-half-away; a carry into the exponent is the right rounding up (to infinity past the
// largest TF32).
inline uint32_t cvt_rna_tf32(float x) {
    uint32_t bits = std::bit_cast<uint32_t>(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;  // inf or NaN
    return (bits + 0x1000u) & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: D (16 x 8) = A (16 x 8) B (8 x 8) + C,
// one warp-wide instruction. Each lane holds a fragment of each matrix; with g = lane / 4
// (the PTX ISA's groupID) and t = lane % 4 (threadID_in_group):
//   a[0] = A[g][t]   a[1] = A[g + 8][t]   a[2] = A[g][t + 4]   a[3] = A[g + 8][t + 4]
//   b[0] = B[t][g]   b[1] = B[t + 4][g]
//   c[0] = C[g][2t]  c[1] = C[g][2t + 1]  c[2] = C[g + 8][2t]  c[3] = C[g + 8][2t + 1]
// Every lane posts its A and B words, waits for the warp (the instruction is .sync: all 32
// lanes execute it together), then computes its four elements of D from the others'. The
// operands are TF32: their 13 low bits are ignored, as the tensor cores ignore them, so a
// kernel that forgets cvt.rna.tf32 sees truncation, not float32. A product of two TF32 numbers
// is exact in float32; the eight are added to c in k order, each rounded to float32 (the
// hardware's order and intermediate width are not specified: results agree to float32's
// rounding, not bit for bit).
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                             int line) {
    count(kMma);
    const int tid = linear_thread();
    Warp& warp = *current_block->warps[tid / kWarp];
    const int lane = tid % kWarp;
    if (warp.lanes != kWarp)
        throw Error("mma.sync on line " + std::to_string(line) + " in a warp of " +
                    std::to_string(warp.lanes) + " threads: the instruction needs all 32 lanes "
                    "(make the block size a multiple of 32)");
    const int parity = current_parity;
    current_parity ^= 1;
    uint32_t* mine = warp.fragments[parity][lane];
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    for (int i = 0; i < 2; ++i) mine[4 + i] = b[i];
    warp.barrier.arrive("mma.sync", line);
    auto tf32 = [](uint32_t word) { return std::bit_cast<float>(word & 0xffffe000u); };
    auto A = [&](int row, int k) {  // the lane and register that hold A[row][k]
        return tf32(warp.fragments[parity][(row % 8) * 4 + k % 4][(row >= 8) + 2 * (k >= 4)]);
    };
    auto B = [&](int k, int col) { return tf32(warp.fragments[parity][col * 4 + k % 4][4 + (k >= 4)]); };
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float acc = d[i];
        for (int k = 0; k < 8; ++k) acc = std::fma(A(row, k), B(k, col), acc);
        d[i] = acc;
    }
}

// The life of one emulated thread: set the built-in variables, run the kernel, leave the
// barriers; on an Error, record it (the block's first wins) and wake the rest of the block.
inline void run_thread(Block& state, const std::function<void()>& body, int tid, dim3 grid,
                       dim3 block, uint3 block_index) {
    threadIdx = uint3(tid % block.x, tid / block.x % block.y, tid / (block.x * block.y));
    blockIdx = block_index;
    blockDim = block;
    gridDim = grid;
    current_block = &state;
    current_parity = 0;
    std::string error;
#ifdef EMU_COUNT
    Counts counts;
    struct AddCounts {  // on every way out of the body, even an Error
        Counts& counts;
        ~AddCounts() {
            thread_counts = nullptr;
            std::lock_guard lock(counts_mutex);
            for (int i = 0; i < kNumCounts; ++i) launch_counts.n[i] += counts.n[i];
        }
    } add_counts{counts};
    thread_counts = &counts;
#endif
    try {
        body();
#ifdef EMU_COUNT
        thread_counts = nullptr;  // the barriers' bookkeeping below is not the kernel's
#endif
        state.barrier.leave("__syncthreads");
        state.warps[tid / kWarp]->barrier.leave("shuffle");
        return;
    } catch (const Error& e) {
        error = e.what();
    } catch (const Abort&) {
        return;
    } catch (const std::exception& e) {
        error = std::string("the kernel threw: ") + e.what();
    }
    {
        std::lock_guard lock(state.error_mutex);
        if (state.error.empty()) state.error = error;
    }
    state.abort();
}

// Run block `block_index` of the grid: one std::thread per CUDA thread. Returns the first
// Error any of them met, or an empty string.
inline std::string run_block(const std::function<void()>& body, dim3 grid, dim3 block,
                             uint3 block_index) {
    const int n = (int)(block.x * block.y * block.z);
    Block state(n);
    std::vector<std::thread> threads;
    threads.reserve(n);
    auto join_all = [&] {
        for (auto& thread : threads) thread.join();
    };
    for (int tid = 0; tid < n; ++tid) {
        try {
            threads.emplace_back(run_thread, std::ref(state), std::cref(body), tid, grid, block,
                                 block_index);
        } catch (const std::system_error& e) {  // the OS refused another thread
            state.abort();                        // the started ones wait for it: release them
            join_all();
            throw Error("could not start thread " + std::to_string(tid) + " of the block (" +
                        e.what() + "): raise the process's thread limit (ulimit -u)");
        }
    }
    join_all();
    return state.error;
}

// One kernel argument from cudaLaunchKernel-style `void** args`: args[i] points at the value.
template <class T>
T arg(void** args, std::size_t i) {
    T value;
    std::memcpy(&value, args[i], sizeof(T));
    return value;
}

// A letter per parameter type, which Python checks the arguments against: f float, d double,
// i / I 32-bit signed / unsigned, q / Q 64-bit, ? anything else; '*' before it for a pointer.
template <class T>
constexpr char type_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return 'f';
    else if constexpr (std::is_same_v<U, double>) return 'd';
    else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) return std::is_signed_v<U> ? 'i' : 'I';
    else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) return std::is_signed_v<U> ? 'q' : 'Q';
    else return '?';
}

template <class T>
std::string param_code() {
    if constexpr (std::is_pointer_v<T>) return "*" + std::string(1, type_code<std::remove_pointer_t<T>>());
    else return std::string(1, type_code<T>());
}

template <class... Args>
const char* signature(void (*)(Args...)) {
    static const std::string codes = (std::string() + ... + param_code<Args>());
    return codes.c_str();
}

inline std::mutex launch_mutex;  // one launch at a time: every block uses the same buffer
inline thread_local std::string last_error;

// Launch `kernel` on grid x block with `shared_bytes` of dynamic shared memory at `shared`
// (capacity `shared_capacity`). Returns 0, or 1 with the message in last_error.
template <class... Args>
int launch(void (*kernel)(Args...), const char* name, const unsigned* grid3,
           const unsigned* block3, std::size_t shared_bytes, void* shared,
           std::size_t shared_capacity, void** args) {
    const dim3 grid(grid3[0], grid3[1], grid3[2]), block(block3[0], block3[1], block3[2]);
    const std::string where = std::string(name) + ": ";
    try {
        const unsigned long long threads = 1ull * block.x * block.y * block.z;
        if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
            throw Error("grid and block dimensions must be at least 1");
        if (threads > kMaxThreadsPerBlock)
            throw Error("a block of " + std::to_string(threads) + " threads exceeds the " +
                        std::to_string(kMaxThreadsPerBlock) + " threads a block may have");
        if (block.z > 64 || grid.y > 65535 || grid.z > 65535)
            throw Error("block.z must be <= 64 and grid.y, grid.z <= 65535");
        if (shared_bytes > shared_capacity)
            throw Error("the emulator's shared memory buffer holds " +
                        std::to_string(shared_capacity) + " bytes; asked for " +
                        std::to_string(shared_bytes));
        std::lock_guard lock(launch_mutex);
        auto call = [&]<std::size_t... I>(std::index_sequence<I...>) {
            kernel(arg<Args>(args, I)...);
        };
        const std::function<void()> body = [&] { call(std::index_sequence_for<Args...>{}); };
#ifdef EMU_ASAN
        ASAN_UNPOISON_MEMORY_REGION(shared, shared_capacity);
        ASAN_POISON_MEMORY_REGION((char*)shared + shared_bytes, shared_capacity - shared_bytes);
#endif
#ifdef EMU_COUNT
        launch_counts = Counts{};
        shared_range = {reinterpret_cast<std::uintptr_t>(shared),
                        reinterpret_cast<std::uintptr_t>(shared) + shared_capacity};
#endif
        for (unsigned z = 0; z < grid.z; ++z)
            for (unsigned y = 0; y < grid.y; ++y)
                for (unsigned x = 0; x < grid.x; ++x) {
                    // Garbage, as on a GPU: NaN makes a read before a write visible.
                    std::memset(shared, 0xff, shared_bytes);
                    std::string error = run_block(body, grid, block, uint3(x, y, z));
                    if (!error.empty())
                        throw Error("block (" + std::to_string(x) + ", " + std::to_string(y) +
                                    ", " + std::to_string(z) + "): " + error);
                }
        return 0;
    } catch (const Error& e) {
        last_error = where + e.what();
        return 1;
    }
}

// Shuffles with a width below 32 split the warp into segments; the emulator does not.
inline void check_width(int width, int line) {
    if (width != kWarp)
        throw Error("shuffle on line " + std::to_string(line) + " with width " +
                    std::to_string(width) + ": the emulator supports the full warp (32) only");
}

}  // namespace emu

#ifdef EMU_COUNT
// The hooks -fsanitize=thread instrumentation calls, defined here instead of by TSan's runtime
// (which the counting build does not link): loads and stores are counted, the rest ignored.
#define EMU_TSAN_ACCESS(N)                                                                    \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_read##N(void* p) {             \
        ::emu::count_access(p, N, false);                                                      \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_write##N(void* p) {            \
        ::emu::count_access(p, N, true);                                                       \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_unaligned_read##N(void* p) {   \
        ::emu::count_access(p, N, false);                                                      \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_unaligned_write##N(void* p) {  \
        ::emu::count_access(p, N, true);                                                       \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_volatile_read##N(void* p) {    \
        ::emu::count_access(p, N, false);                                                      \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_volatile_write##N(void* p) {   \
        ::emu::count_access(p, N, true);                                                       \
    }
EMU_TSAN_ACCESS(1)
EMU_TSAN_ACCESS(2)
EMU_TSAN_ACCESS(4)
EMU_TSAN_ACCESS(8)
EMU_TSAN_ACCESS(16)
// An access of a size the above do not cover (a large struct copy): one instruction.
extern "C" __attribute__((no_sanitize_thread)) void __tsan_read_range(void* p, unsigned long n) {
    ::emu::count_access(p, n, false);
}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_write_range(void* p, unsigned long n) {
    ::emu::count_access(p, n, true);
}
// Atomic loads and stores (a function-local static's guard is one): done, not counted.
#define EMU_TSAN_ATOMIC(N, T)                                                                  \
    extern "C" __attribute__((no_sanitize_thread)) T __tsan_atomic##N##_load(                \
        const volatile T* a, int) {                                                            \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                           \
    }                                                                                          \
    extern "C" __attribute__((no_sanitize_thread)) void __tsan_atomic##N##_store(             \
        volatile T* a, T v, int) {                                                             \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                              \
    }
EMU_TSAN_ATOMIC(8, unsigned char)
EMU_TSAN_ATOMIC(16, unsigned short)
EMU_TSAN_ATOMIC(32, unsigned int)
EMU_TSAN_ATOMIC(64, unsigned long long)
extern "C" __attribute__((no_sanitize_thread)) void __tsan_init() {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_func_entry(void*) {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_func_exit() {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_vptr_update(void**, void*) {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_vptr_read(void**) {}

// Python sets the global ranges before a launch and reads the counts after it.
extern "C" void emu_count_set_global_ranges(const unsigned long long* ranges, int n) {
    ::emu::n_global_ranges = std::min(n, ::emu::kMaxRanges);
    for (int i = 0; i < ::emu::n_global_ranges; ++i)
        ::emu::global_ranges[i] = {(std::uintptr_t)ranges[2 * i], (std::uintptr_t)ranges[2 * i + 1]};
}
extern "C" void emu_count_get(unsigned long long* out) {
    for (int i = 0; i < ::emu::kNumCounts; ++i) out[i] = ::emu::launch_counts.n[i];
}

// A multiply-add the kernel writes as fmaf(a, b, c) is counted, then computed as CUDA does:
// rounded once.
namespace emu {
__forceinline__ float counted_fmaf(float a, float b, float c) {
    count(kFma);
    return std::fma(a, b, c);
}
}  // namespace emu
#define fmaf(a, b, c) ::emu::counted_fmaf((a), (b), (c))
#define __fmaf_rn(a, b, c) ::emu::counted_fmaf((a), (b), (c))
#else
__forceinline__ float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
#endif

// __LINE__ names the call site in errors and tells apart barriers that threads reach apart.
#define __syncthreads() ::emu::syncthreads(__LINE__)
// The optional width argument must be 32 (checked): 32 __VA_OPT__(* 0 + (width)) is the
// width when one is given, else 32.
#define EMU_WIDTH(...) ::emu::check_width(32 __VA_OPT__(*0 + (__VA_ARGS__)), __LINE__)
#define __shfl_sync(mask, v, src, ...) \
    (EMU_WIDTH(__VA_ARGS__), ::emu::shuffle((mask), (v), (src) & 31, __LINE__))
#define __shfl_xor_sync(mask, v, lane_mask, ...)           \
    (EMU_WIDTH(__VA_ARGS__),                               \
     ::emu::shuffle((mask), (v), ::emu::linear_thread() % 32 ^ (lane_mask), __LINE__))
#define __shfl_down_sync(mask, v, delta, ...) \
    (EMU_WIDTH(__VA_ARGS__),                  \
     ::emu::shuffle((mask), (v), ::emu::linear_thread() % 32 + (delta), __LINE__))
#define __shfl_up_sync(mask, v, delta, ...) \
    (EMU_WIDTH(__VA_ARGS__),                \
     ::emu::shuffle((mask), (v), ::emu::linear_thread() % 32 - (int)(delta), __LINE__))
