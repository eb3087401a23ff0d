/*
 * kdn.h — the public C ABI of libkdn, the client library engines link to talk to kdnd.
 *
 * An engine process connects once (kdn_connect), registers each model it serves
 * (kdn_register_model), and then, per request:
 *   1. kdn_lookup: how many leading tokens of this prompt are cached on the node?
 *   2. kdn_retrieve_lease / kdn_retrieve_to: load those tokens' KV (zero-copy pointers into
 *      the shared host arena, or a copy into the engine's own KV buffer);
 *   3. prefill the rest;
 *   4. kdn_store_reserve + write + kdn_store_commit (zero-copy), or kdn_store_from (copy):
 *      publish the newly computed chunks to every engine on the node.
 *
 * Data model. A chunk is the KV of `chunk_tokens` consecutive tokens (default 256) for all
 * layers of one model, laid out canonically as [layer][K|V][token][kv_head][head_dim] in the
 * model's dtype. Chunks are addressed by 128-bit prefix keys:
 *     key_0 = H(fingerprint, tokens[0, T)),  key_i = H(key_{i-1}, fingerprint, tokens[iT, (i+1)T))
 * so a chunk's key names the whole prefix up to and including it. Only whole chunks of a prefix
 * are stored. Segments (see below) are keyed independently of their position instead.
 *
 * Ownership. Every handle returned by this library is owned by the caller and released with
 * the matching kdn_*_release / kdn_disconnect call. Pointers inside a lease stay valid until
 * the lease is released; pointers inside a store reservation until commit or abort. A client
 * that exits without releasing loses its leases and reservations; kdnd reclaims them.
 *
 * Integrity. Leased chunk bytes are read-only (the arena is mapped read-only, and kdnd sealed
 * it against writes by anyone but itself), so no engine can change a chunk another engine
 * reads. A reservation's slot lies in the client's own staging area; kdn_store_commit has kdnd
 * copy it into the arena, after which the client's slot is no longer the chunk.
 *
 * Thread safety. A kdn_client is NOT thread-safe: use one per thread, or serialize calls.
 * Model handles, leases and reservations belong to the client that created them.
 *
 * Errors. Functions return 0 (KDN_OK) or a negative kdn_status; kdn_strerror names it.
 * No function of this library aborts or throws on bad input.
 */
#ifndef KDN_KDN_H_
#define KDN_KDN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(KDN_SHIM_BUILDING)
#define KDN_API __attribute__((visibility("default")))
#else
#define KDN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header's ABI. kdn_abi_version() returns the library's. */
#define KDN_ABI_VERSION 2u
/* Calls added within ABI 2, by the minor that brought them: 1 kdn_prefetch; 2 the segment calls
 * (kdn_context_key, kdn_segment_*); 3 the GPU calls (kdn_gpu_*); 4 kdn_gpu_blend_select, kdn_gpu_check and
 * kdn_gpu_prefetch; 5 kdn_session_info.max_lease_bytes (a caller built against an older header passes the
 * older struct_size, and gets the fields it knows). kdn_abi_minor() returns the library's. A call that needs a newer
 * kdnd than the one connected returns KDN_ERR_UNSUPPORTED. */
#define KDN_ABI_MINOR 5u
/* Version of the wire protocol between libkdn and kdnd (checked at handshake). */
#define KDN_PROTOCOL_VERSION 2u

/* ---- status codes ------------------------------------------------------------------- */
typedef enum kdn_status {
  KDN_OK = 0,
  KDN_ERR_INVALID_ARGUMENT = -1, /* a caller-supplied argument is out of range or NULL */
  KDN_ERR_NOT_FOUND = -2,        /* key, model or handle unknown */
  KDN_ERR_NO_SPACE = -3,         /* the tier is full of leased/reserved chunks */
  KDN_ERR_PROTOCOL = -4,         /* a malformed message, ring entry or payload reference */
  KDN_ERR_VERSION = -5,          /* protocol or ABI version mismatch */
  KDN_ERR_PERMISSION = -6,       /* credentials or token refused */
  KDN_ERR_UNAVAILABLE = -7,      /* kdnd not running or the connection is closed */
  KDN_ERR_TIMEOUT = -8,          /* a wait ran out of time */
  KDN_ERR_IN_PROGRESS = -9,      /* an async op has not completed yet (kdn_op_poll) */
  KDN_ERR_BUSY = -10,            /* too many operations in flight; retry after completing one */
  KDN_ERR_IO = -11,              /* an operating-system call failed */
  KDN_ERR_NO_MEMORY = -12,       /* allocation failed */
  KDN_ERR_CORRUPT = -13,         /* data failed an integrity check */
  KDN_ERR_MODEL_MISMATCH = -14,  /* layout or model descriptor incompatible with the chunk */
  KDN_ERR_UNSUPPORTED = -15,     /* a feature this build or this kdnd does not have */
  KDN_ERR_INTERNAL = -16,        /* a bug: please report */
  KDN_ERR_LIMIT = -17            /* a configured limit (leases, reservations, staging, sessions,
                                    models, requests in flight) would be exceeded; nothing was done */
} kdn_status;

KDN_API const char* kdn_strerror(int status);
KDN_API uint32_t kdn_abi_version(void);
KDN_API uint32_t kdn_abi_minor(void);

/* ---- model descriptors ---------------------------------------------------------------- */
typedef enum kdn_dtype { KDN_DTYPE_F16 = 1, KDN_DTYPE_BF16 = 2, KDN_DTYPE_F32 = 3, KDN_DTYPE_FP8_E4M3 = 4 } kdn_dtype;

typedef enum kdn_rope_style {
  KDN_ROPE_NONE = 0,
  KDN_ROPE_NEOX = 1, /* pairs (i, i + R/2) */
  KDN_ROPE_GPTJ = 2  /* pairs (2i, 2i + 1) */
} kdn_rope_style;

typedef enum kdn_rope_scaling {
  KDN_ROPE_SCALING_NONE = 0,
  KDN_ROPE_SCALING_LINEAR = 1,
  KDN_ROPE_SCALING_LLAMA3 = 2,
  KDN_ROPE_SCALING_YARN = 3
} kdn_rope_scaling;

/* Everything that decides whether two engines' KV bytes are interchangeable. Two
 * descriptors with equal fields have equal fingerprints; any difference is a cache miss.
 * Zero-initialize, then fill; unused fields stay zero. */
typedef struct kdn_model_desc {
  uint32_t struct_size;  /* sizeof(kdn_model_desc) */
  uint32_t num_layers;   /* layers with a KV cache, 1..1024 */
  uint32_t num_kv_heads; /* KV heads on this TP rank, 1..1024 */
  uint32_t head_dim;     /* 1..4096 */
  uint32_t dtype;        /* kdn_dtype of the stored KV */
  uint32_t chunk_tokens; /* tokens per chunk; 0 means the default, 256 */
  uint32_t rope_style;   /* kdn_rope_style */
  uint32_t rotary_dim;   /* 0 means head_dim */
  double rope_theta;
  uint32_t rope_scaling; /* kdn_rope_scaling */
  float rope_scaling_params[4];
  uint32_t k_channel_order;  /* 0 = Hugging Face order, 1 = llama.cpp permuted (GPT-J pairs) */
  uint32_t tp_rank, tp_size; /* tp_size 0 means 1 */
  char name[64];             /* model identity, e.g. "meta-llama/Llama-3.1-8B@rev" (NUL-terminated) */
  uint8_t engine_salt[32];   /* engine-specific identity (e.g. llama.cpp build + file hash) */
} kdn_model_desc;

/* A 128-bit chunk key. */
typedef struct kdn_key {
  uint64_t lo, hi;
} kdn_key;

/* Bytes of one chunk of this model in the canonical layout, or 0 if the descriptor is invalid. */
KDN_API uint64_t kdn_chunk_bytes(const kdn_model_desc* desc);
/* Validates desc; KDN_OK or KDN_ERR_INVALID_ARGUMENT. */
KDN_API int kdn_model_validate(const kdn_model_desc* desc);
/* The model fingerprint (128-bit) of a valid descriptor. */
KDN_API int kdn_model_fingerprint(const kdn_model_desc* desc, kdn_key* out);
/* Prefix keys of the whole chunks of tokens[0, n_tokens): writes min(n_tokens / T, max_keys)
 * keys and stores that count in *n_keys. Deterministic across processes and restarts. */
KDN_API int kdn_prefix_keys(const kdn_model_desc* desc, const int32_t* tokens, size_t n_tokens, kdn_key* keys,
                            size_t max_keys, size_t* n_keys);

/* ---- connection ------------------------------------------------------------------------ */
typedef struct kdn_client kdn_client;

/* kdn_connect_opts.flags */
#define KDN_CONNECT_CREATE_NAMESPACE 1u /* create name_space if kdnd allows this client to */
#define KDN_CONNECT_READ_ONLY 2u        /* no staging area: this client never stores */
#define KDN_CONNECT_ADMIN                                 \
  4u /* ask for admin rights (granted only to uids kdnd's \
        configuration names; see kdn_session_info.admin) */

typedef struct kdn_connect_opts {
  uint32_t struct_size;    /* sizeof(kdn_connect_opts) */
  const char* socket_path; /* NULL: $KDN_SOCKET, else $XDG_RUNTIME_DIR/kdn/kdnd.sock, else /tmp/kdn-$UID/kdnd.sock */
  const char* name_space;  /* tenant; NULL or "" means "default" (at most 63 bytes) */
  const char* token;       /* shared secret if kdnd requires one; NULL otherwise */
  uint32_t ring_entries;   /* submission/completion ring size, power of two; 0 = 256 */
  uint32_t payload_bytes;  /* client payload area; 0 = 1 MiB */
  uint32_t timeout_ms;     /* handshake and default wait timeout; 0 = 5000 */
  uint32_t flags;          /* KDN_CONNECT_* */
  uint64_t staging_bytes;  /* staging area for stores (4 KiB multiple); 0 = 256 MiB. Its
                              pages are allocated as they are first written. */
} kdn_connect_opts;

/* Connects to kdnd. opts may be NULL (all defaults). On success *out owns the connection.
 * If kdnd goes away (a restart), calls fail with KDN_ERR_UNAVAILABLE at once, and a later
 * call connects again by itself once kdnd is back (at most one attempt per 200 ms), with the
 * same namespace, token and flags, registering every model of the client again: kdn_model
 * handles stay valid. Leases, reservations and ops of the lost connection are gone with it:
 * releasing them is still required and sends nothing (a lease's bytes stay readable until
 * then; a commit of a lost reservation fails with KDN_ERR_UNAVAILABLE).
 * KDN_ERR_VERSION: kdnd speaks another protocol version; KDN_ERR_NOT_FOUND: no such
 * namespace (and none was to be created); KDN_ERR_PERMISSION: this uid, group or token may
 * not open it; KDN_ERR_LIMIT: too many sessions, or more staging than kdnd allows. */
KDN_API int kdn_connect(const kdn_connect_opts* opts, kdn_client** out);
/* Closes the connection, releasing every lease and aborting every open reservation. */
KDN_API void kdn_disconnect(kdn_client* client);
/* Round trip through the rings with no work (for health checks and latency probes). */
KDN_API int kdn_ping(kdn_client* client);

/* What kdnd granted this session: its staging area and the limits it enforces. */
typedef struct kdn_session_info {
  uint32_t struct_size;            /* sizeof(kdn_session_info) */
  uint32_t admin;                  /* nonzero if granted admin rights on the namespace */
  uint64_t staging_bytes;          /* bytes of reserved slots this session may hold at once */
  uint64_t arena_bytes;            /* the namespace's host arena */
  uint32_t max_leases;             /* distinct chunks leased at once */
  uint32_t max_lease_count;        /* repeated leases of one chunk */
  uint32_t max_reservations;       /* open reservations */
  uint32_t max_in_flight;          /* requests in flight */
  uint32_t max_models;             /* models registered */
  uint32_t reservation_timeout_ms; /* an uncommitted reservation is aborted after this */
  uint64_t max_lease_bytes;        /* bytes of the distinct chunks leased at once (ABI minor 5; 0 when
                                      the daemon does not say: one older than protocol minor 6) */
} kdn_session_info;
KDN_API int kdn_get_session_info(kdn_client* client, kdn_session_info* out);

/* ---- models -------------------------------------------------------------------------- */
typedef struct kdn_model kdn_model; /* owned by the client; freed by kdn_disconnect */
KDN_API int kdn_register_model(kdn_client* client, const kdn_model_desc* desc, kdn_model** out);
KDN_API uint64_t kdn_model_chunk_bytes(const kdn_model* model);
KDN_API uint32_t kdn_model_chunk_tokens(const kdn_model* model);
/* The most chunks of this model one kdn_store_reserve may ask for (staging area and
 * reservation limit); 0 for a read-only client. kdn_store_from splits larger stores itself. */
KDN_API uint32_t kdn_store_max_chunks(kdn_client* client, const kdn_model* model);

/* ---- lookup ---------------------------------------------------------------------------- */
#define KDN_TIER_COUNT 4u /* 0 GPU, 1 host, 2 disk, 3 remote */
typedef struct kdn_lookup_result {
  uint32_t hit_chunks;                  /* leading whole chunks present in some tier */
  uint64_t hit_tokens;                  /* hit_chunks * chunk_tokens */
  uint32_t tier_chunks[KDN_TIER_COUNT]; /* of those, how many have their fastest copy in each tier */
} kdn_lookup_result;

KDN_API int kdn_lookup(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                       kdn_lookup_result* out);
/* The same with keys from kdn_prefix_keys (keys[0] must be chunk 0's key): for engines that
 * hash a request's tokens once and use the keys for lookup, lease and store. */
KDN_API int kdn_lookup_keys(kdn_client* client, const kdn_model* model, const kdn_key* keys, size_t n_keys,
                            kdn_lookup_result* out);

/* Starts bringing the cached prefix of tokens[0, n_tokens) into the host tier — its chunks
 * that sit only in a slower tier (disk) — and returns at once without waiting for kdnd. A
 * later kdn_retrieve_lease finds them there, or waits for the reads still in flight. Call it
 * as early as the prefix is known (before tokenizing the rest of a prompt, before a prefill):
 * the reads then overlap the engine's own work. KDN_ERR_UNSUPPORTED from a kdnd that predates
 * it (protocol minor 0); KDN_ERR_BUSY when the rings are full. */
KDN_API int kdn_prefetch(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens);

/* ---- zero-copy retrieve: leases ---------------------------------------------------------- */
typedef struct kdn_lease kdn_lease;
/* Leases the longest cached prefix of whole chunks among tokens[0, n_tokens), at most
 * max_chunks of them (0 = no limit). *out may hold zero chunks (a miss is not an error).
 * While leased, chunks are never evicted or moved. */
KDN_API int kdn_retrieve_lease(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                               uint32_t max_chunks, kdn_lease** out);
KDN_API uint32_t kdn_lease_chunks(const kdn_lease* lease);
/* Read-only canonical bytes of chunk i of the lease (kdn_model_chunk_bytes long). */
KDN_API const void* kdn_lease_chunk_data(const kdn_lease* lease, uint32_t i);
KDN_API int kdn_lease_release(kdn_client* client, kdn_lease* lease);

/* Copies chunk bytes between engine memory and a lease or reservation slot. Large copies use
 * streaming (non-temporal) stores, which glibc's memcpy only uses above a size threshold far
 * beyond a chunk (hundreds of MiB on many machines); for chunk-sized copies that avoids
 * read-for-ownership traffic and cache pollution, about 1.5x the bandwidth of memcpy.
 * Ends with a store fence, so dst is complete before, e.g., kdn_store_commit. */
KDN_API void kdn_copy_chunk(void* dst, const void* src, size_t bytes);

/* ---- zero-copy store: reservations -------------------------------------------------------- */
typedef struct kdn_store kdn_store;
/* Reserves slots for chunks [first_chunk, first_chunk + n_chunks) of tokens[0, n_tokens).
 * Chunks already cached or being stored by another client get no slot
 * (kdn_store_chunk_data returns NULL for them): skip computing them into the slot. So do the
 * last chunks when the arena is full of leased chunks. KDN_ERR_LIMIT if n_chunks is more than
 * kdn_store_max_chunks or the session's open reservations would pass its limit. Slots lie in
 * this client's staging area; uncommitted reservations are aborted by kdnd after
 * kdn_session_info.reservation_timeout_ms. */
KDN_API int kdn_store_reserve(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                              uint32_t first_chunk, uint32_t n_chunks, kdn_store** out);
KDN_API uint32_t kdn_store_chunks(const kdn_store* store);
/* Writable slot for chunk i of the reservation, or NULL if no write is needed. */
KDN_API void* kdn_store_chunk_data(kdn_store* store, uint32_t i);
/* Publishes every reserved chunk: kdnd copies each slot into the shared arena and returns
 * once every copy is done. Consumes the handle. */
KDN_API int kdn_store_commit(kdn_client* client, kdn_store* store);
/* Drops every reserved chunk; consumes the handle. */
KDN_API int kdn_store_abort(kdn_client* client, kdn_store* store);

/* ---- copy variants: engine buffers described by a strided layout ---------------------------
 * Element (kv, layer l, token t, head h, dim d) of the engine buffer lives at
 *     layer_base[l] + kv*stride_kv + blk*stride_block + off*stride_offset + h*stride_head + d*stride_dim
 * (strides in elements of engine_dtype), where slot = slot_mapping[t] (or t if slot_mapping is
 * NULL), blk = slot / block_size, off = slot % block_size. Slots < 0 are skipped. This one form
 * covers vLLM flash-attn/flashinfer NHD and HND, SGLang's token pool and llama.cpp rows
 * (transposed V: stride_offset = 1, stride_dim = kv_size, via v_* overrides). */
typedef struct kdn_engine_layout {
  uint32_t struct_size;
  uint32_t engine_dtype;   /* kdn_dtype of the engine buffer (converted if != model dtype) */
  void* const* layer_base; /* num_layers pointers */
  int64_t stride_kv, stride_block, stride_offset, stride_head, stride_dim;
  int64_t block_size;          /* tokens per block; 1 for a token pool */
  const int64_t* slot_mapping; /* one slot per token of the range, or NULL for identity */
  /* If v_layer_base is non-NULL, V uses these bases and v_stride_* (stride_kv is ignored). */
  void* const* v_layer_base;
  int64_t v_stride_block, v_stride_offset, v_stride_head, v_stride_dim;
} kdn_engine_layout;

/* Gathers chunks [first_chunk, first_chunk + n_chunks) from the engine buffer and stores
 * them. Token t of chunk c is engine token (c - first_chunk) * T + t of the layout's mapping.
 * *stored (may be NULL) receives the number of chunks actually written (not already cached). */
KDN_API int kdn_store_from(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                           uint32_t first_chunk, uint32_t n_chunks, const kdn_engine_layout* src, uint32_t* stored);
/* Scatters the longest cached prefix (at most max_chunks, 0 = all) into the engine buffer;
 * token t of chunk c goes to engine token c * T + t of the layout's mapping.
 * *loaded_chunks receives how many chunks were written. */
KDN_API int kdn_retrieve_to(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                            uint32_t max_chunks, const kdn_engine_layout* dst, uint32_t* loaded_chunks);

/* ---- segments: non-prefix reuse (docs/blend.md) ---------------------------------------------
 * A segment is a span of tokens (a document, tokenized alone) whose KV was computed at
 * positions base_pos, base_pos + 1, ... right after a fixed base context (for example BOS and
 * the system prompt), so its first token is not an attention sink by accident. Its KV can be
 * loaded at any other position of a later prompt: K is re-rotated by
 * delta = target_pos - base_pos in the same pass that scatters it into the engine's buffer.
 * Keys (position-independent; see kdn_segment_keys):
 *     s   = H(fingerprint, base_key, base_pos)
 *     k_0 = H(s, fingerprint, tokens[0, T)),  k_i = H(k_{i-1}, fingerprint, tokens[iT, min((i+1)T, n)))
 * A segment is stored as ceil(n / T) chunks; the last one may be partial (its rows past the
 * segment's end are zero). Segment chunks are chunks like any other in kdnd: same tiers,
 * eviction, leases and namespaces. Added in ABI 2 (protocol minor 2; an older kdnd answers the
 * calls that reach it with KDN_ERR_UNSUPPORTED). */
#define KDN_SEGMENT_MAX_TOKENS (1ull << 24) /* tokens of one segment */
#define KDN_MAX_POSITION (1ll << 40)        /* |base_pos|, |target_pos| + n_tokens */
#define KDN_SEGMENT_MISS 0xFFu              /* hit map entry of a chunk that is not cached */

typedef struct kdn_segment {
  uint32_t struct_size;  /* sizeof(kdn_segment) */
  uint32_t reserved;     /* zero */
  const int32_t* tokens; /* the segment's tokens */
  uint64_t n_tokens;     /* 1 .. KDN_SEGMENT_MAX_TOKENS */
  kdn_key base_key;      /* kdn_context_key of the base context ({0, 0}: none) */
  int64_t base_pos;      /* position of tokens[0] when its KV was computed: 0 .. KDN_MAX_POSITION */
} kdn_segment;

/* The key of a base context (tokens[0, n_tokens), n_tokens may be 0). */
KDN_API int kdn_context_key(const kdn_model_desc* desc, const int32_t* tokens, size_t n_tokens, kdn_key* out);
/* A segment's chunk keys: writes min(ceil(n_tokens / T), max_keys) keys, their count to
 * *n_keys. keys[ceil(n_tokens / T) - 1] is the segment's key. */
KDN_API int kdn_segment_keys(const kdn_model_desc* desc, const kdn_segment* seg, kdn_key* keys, size_t max_keys,
                             size_t* n_keys);

typedef struct kdn_segment_hits {
  uint32_t chunks;         /* ceil(n_tokens / chunk_tokens) */
  uint32_t cached_chunks;  /* of those, cached in some tier */
  uint32_t leading_chunks; /* cached chunks before the first one that is not */
  uint32_t map_offset;     /* the segment's entries in the hit map: map[map_offset + i] */
  uint64_t cached_tokens;  /* tokens of the leading cached chunks (n_tokens when all are) */
} kdn_segment_hits;

/* Looks up several segments in one round trip. hits[s] describes segs[s]; hit_map gets one
 * entry per chunk, the segments' chunks in order (hits[s].map_offset): the tier of its fastest
 * copy (0 GPU, 1 host, 2 disk, 3 remote) or KDN_SEGMENT_MISS. hit_map_len must hold the
 * chunks of every segment (at most 65,536 in one call); KDN_ERR_INVALID_ARGUMENT otherwise. */
KDN_API int kdn_segment_lookup(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                               kdn_segment_hits* hits, uint8_t* hit_map, size_t hit_map_len);

/* Gathers a segment's KV from the engine buffer and stores its chunks (those not cached yet):
 * token t of the segment is engine token t of src's mapping, its KV as computed at
 * base_pos + t. *stored_chunks (may be NULL) receives the chunks written. */
KDN_API int kdn_segment_store_from(kdn_client* client, const kdn_model* model, const kdn_segment* seg,
                                   const kdn_engine_layout* src, uint32_t* stored_chunks);

/* Loads segments into the engine buffer at target positions: segment s goes to engine tokens
 * off_s .. off_s + n_tokens_s - 1 of dst's mapping, off_s = the n_tokens of the segments
 * before it, with K rotated by target_pos[s] - segs[s].base_pos (fused into the scatter).
 * Every chunk is leased through kdnd (promoted from slower tiers as needed) in one round trip.
 * loaded_tokens[s] (an array of n_segs, may be NULL) receives the tokens written: the
 * segment's leading cached chunks. KDN_OK if every segment was loaded whole;
 * KDN_ERR_NOT_FOUND if one was not (loaded_tokens says how far each got);
 * KDN_ERR_INVALID_ARGUMENT for a target position that is negative or whose segment would end
 * past KDN_MAX_POSITION, or a bad layout. */
KDN_API int kdn_segment_retrieve_to(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                    const int64_t* target_pos, const kdn_engine_layout* dst, uint64_t* loaded_tokens);

/* ---- async operations: post -> poll/wait -> release ------------------------------------------ */
typedef struct kdn_op kdn_op; /* an asynchronous lookup or commit */
KDN_API int kdn_lookup_post(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                            kdn_op** out);
/* KDN_OK when complete, KDN_ERR_IN_PROGRESS while not, another error if it failed. */
KDN_API int kdn_op_poll(kdn_client* client, kdn_op* op);
/* Waits up to timeout_ms (0 = the connection default) for completion. */
KDN_API int kdn_op_wait(kdn_client* client, kdn_op* op, uint32_t timeout_ms);
/* COMMIT without waiting for it: consumes `store` and returns an op that completes once kdnd
 * copied every slot into the arena (the chunks are then published). The staging slots stay
 * the reservation's until then: write nothing more into them. */
KDN_API int kdn_store_commit_post(kdn_client* client, kdn_store* store, kdn_op** out);
/* For a completed lookup op: its result. */
KDN_API int kdn_op_lookup_result(const kdn_op* op, kdn_lookup_result* out);
/* Releases the op; waits for it first if it is still in flight. */
KDN_API void kdn_op_release(kdn_client* client, kdn_op* op);

/* ---- stats ---------------------------------------------------------------------------------- */
typedef struct kdn_stats {
  uint32_t struct_size; /* sizeof(kdn_stats): set by the caller */
  uint32_t reserved0;
  uint64_t lookups, lookup_hit_chunks, lookup_miss_chunks;
  uint64_t stored_chunks, stored_bytes;
  uint64_t retrieved_chunks, retrieved_bytes;
  uint64_t evicted_chunks; /* chunks that left a tier to make room */
  uint64_t dropped_chunks; /* of those, chunks that left the node (no lower tier kept them) */
  uint64_t demoted_chunks, promoted_chunks;
  uint64_t resident_chunks, resident_bytes, capacity_bytes; /* the host tier */
  uint64_t tier_resident_chunks[KDN_TIER_COUNT], tier_resident_bytes[KDN_TIER_COUNT];
  uint64_t tier_capacity_bytes[KDN_TIER_COUNT];
  uint64_t active_leases, open_reservations, in_flight_ops;
  uint64_t sessions, protocol_errors, limit_errors;
  uint64_t corrupt_chunks;       /* chunks found damaged in a tier: dropped, never served */
  uint64_t expired_reservations; /* aborted by kdnd after the reservation timeout */
  uint64_t staging_bytes;        /* staging areas of the namespace's sessions */
  /* Daemon-wide; zero unless this session was granted admin. */
  uint64_t daemon_sessions, daemon_requests, daemon_handshakes_refused, daemon_namespaces;
  /* Host arena bytes of the namespace kdnd is still pre-faulting in the background after its
   * start; 0 once done (copies are slower, never wrong, until then). */
  uint64_t host_prefault_left_bytes;
} kdn_stats;
/* Counters of the client's namespace (and of the daemon, for admin sessions). Set
 * out->struct_size = sizeof(kdn_stats) first. */
KDN_API int kdn_get_stats(kdn_client* client, kdn_stats* out);

/* ---- GPU engines: kdnd copies straight between its tiers and an engine's device KV blocks ----
 * libkdn itself needs no CUDA: the engine makes the CUDA handles (cudaIpcGetMemHandle,
 * cuMemExportToShareableHandle, cudaIpcGetEventHandle) and passes their bytes; kdnd opens each
 * once per registration and does every copy and kernel on its own streams (docs/gpu.md).
 *
 * Register the paged KV memory once per model and device (kdn_gpu_register). Layouts given to
 * kdn_gpu_retrieve / kdn_gpu_store hold the engine's device addresses (layer_base, v_layer_base)
 * inside the registered range [engine_base, engine_base + bytes) and a host slot_mapping;
 * kdnd checks every address the layout reaches against that range and refuses the request
 * (KDN_ERR_INVALID_ARGUMENT) otherwise. Needs a kdnd with a GPU tier (KDN_ERR_UNSUPPORTED
 * otherwise). Added in ABI minor 3 (protocol minor 4). */
#define KDN_GPU_HANDLE_BYTES 64

typedef enum kdn_gpu_memory_kind {
  KDN_GPU_MEMORY_IPC = 1,   /* cudaMalloc / PyTorch's caching allocator: a cudaIpcMemHandle_t */
  KDN_GPU_MEMORY_VMM_FD = 2 /* cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
} kdn_gpu_memory_kind;

typedef struct kdn_gpu_kv_desc {
  uint32_t struct_size;                     /* sizeof(kdn_gpu_kv_desc) */
  uint32_t kind;                            /* kdn_gpu_memory_kind */
  uint8_t device_uuid[16];                  /* cudaDeviceProp::uuid of the device holding the memory */
  uint64_t engine_base;                     /* the engine's address of the registered range's first byte */
  uint64_t bytes;                           /* the registered range's size */
  uint64_t alloc_offset;                    /* engine_base minus the base of the allocation the handle names */
  uint64_t alloc_bytes;                     /* that allocation's size (VMM: as created, granularity-aligned) */
  uint8_t ipc_handle[KDN_GPU_HANDLE_BYTES]; /* KDN_GPU_MEMORY_IPC: cudaIpcGetMemHandle(allocation base) */
  int32_t vmm_fd;    /* KDN_GPU_MEMORY_VMM_FD: the exported fd (libkdn passes a copy; the caller keeps it) */
  uint32_t reserved; /* zero */
  /* An event the engine created with cudaEventInterprocess | cudaEventDisableTiming:
   * cudaIpcGetEventHandle's bytes. Record it on the stream that wrote the KV before
   * kdn_gpu_store: kdnd's gather waits for it. */
  uint8_t engine_event[KDN_GPU_HANDLE_BYTES];
} kdn_gpu_kv_desc;

typedef struct kdn_gpu_kv kdn_gpu_kv;

KDN_API int kdn_gpu_register(kdn_client* client, const kdn_gpu_kv_desc* desc, kdn_gpu_kv** out);
/* kdnd's interprocess event (cudaIpcOpenEventHandle once), recorded after the copies of every
 * kdn_gpu_retrieve of this registration: cudaStreamWaitEvent(stream, event) after the call
 * returns orders the engine's stream behind them, no host thread waits. */
KDN_API const uint8_t* kdn_gpu_kv_done_event(const kdn_gpu_kv* kv);
/* kdnd closes its mappings of the memory (after copies in flight); the handle is freed. */
KDN_API int kdn_gpu_unregister(kdn_client* client, kdn_gpu_kv* kv);
/* Scatters the longest cached prefix (at most max_chunks, 0 = all) into the registered blocks,
 * as kdn_retrieve_to does on the host. Returns once kdnd has queued the copies (the done event
 * follows them); *loaded_chunks receives how many chunks will be written. */
KDN_API int kdn_gpu_retrieve(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                             uint32_t max_chunks, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                             uint32_t* loaded_chunks);
/* Gathers chunks [first_chunk, first_chunk + n_chunks) from the registered blocks and stores
 * them, as kdn_store_from does on the host; kdnd first waits for the engine event. Returns
 * once the chunks are committed. */
KDN_API int kdn_gpu_store(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                          uint32_t first_chunk, uint32_t n_chunks, kdn_gpu_kv* kv, const kdn_engine_layout* src,
                          uint32_t* stored);
/* Loads segments into the registered blocks at target positions, as kdn_segment_retrieve_to
 * does into a host buffer: segment s goes to engine tokens off_s .. off_s + n_tokens_s - 1 of
 * dst's mapping (off_s = the n_tokens of the segments before it), its leading cached chunks
 * only (a partial last chunk writes only the segment's rows), with K rotated on kdnd's stream by
 * target_pos[s] - segs[s].base_pos (delta 0: copied as is). Returns once kdnd has queued the
 * copies (the done event follows them, as for kdn_gpu_retrieve). loaded_chunks[s] (an array of
 * n_segs, may be NULL) receives the chunks of segment s that will be written. KDN_OK if every
 * segment is loaded whole; KDN_ERR_NOT_FOUND if one is not; KDN_ERR_INVALID_ARGUMENT for a
 * target position that is negative or whose segment would end past KDN_MAX_POSITION, or a bad
 * layout; KDN_ERR_UNSUPPORTED for a move of a model without RoPE. Added in ABI minor 3
 * (protocol minor 4: GPU_SEGMENT_RETRIEVE). */
KDN_API int kdn_gpu_segment_retrieve(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                     const int64_t* target_pos, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                                     uint32_t* loaded_chunks);

/* The selection step of a blend (CacheBlend's KV deviation, docs/blend.md), run by kdnd on the
 * device. Call it after kdn_gpu_segment_retrieve of the same segments, target positions and
 * dst, once the engine's check pass has written fresh K and V of layer `check_layer` for the
 * segments' tokens into the registered blocks and recorded the engine event (kdnd waits for it).
 * kdnd compares those rows with its own cached rows of that layer, K re-rotated to the target
 * positions, and selects the tokens of largest deviation: floor(ratio * compared tokens), at
 * least one when ratio > 0 (ratio in [0, 1], in steps of 1e-6). `plane` KDN_BLEND_PLANE_K
 * compares K rows, KDN_BLEND_PLANE_V V rows. Only the chunks a segment retrieve loads are
 * compared (each segment's leading cached chunks); the other tokens are the engine's to
 * recompute anyway. selected[] (room for `capacity`) receives the selected engine tokens in
 * dst's numbering, as kdn_gpu_segment_retrieve places them, ascending; *n_selected their count,
 * *n_compared (may be NULL) the tokens compared. Returns once the selection is known.
 * KDN_ERR_LIMIT if `capacity` is below the selection or the segments do not fit one request;
 * KDN_ERR_INVALID_ARGUMENT for a layer past the model, an unknown plane, a ratio outside [0, 1]
 * or what kdn_gpu_segment_retrieve refuses. Added in ABI minor 4 (protocol minor 5:
 * GPU_BLEND_SELECT). */
/* Brings the longest cached prefix of `tokens` into T0 of the registration's device ahead of its
 * kdn_gpu_retrieve (promoting chunks from disk or the shared tier into host memory first, as a
 * retrieve does), so the retrieve then reads it device to device; nothing is written into the
 * engine's blocks. Returns once kdnd has queued the copies (with tier.gpu.codec: the encodings).
 * *cached_chunks (may be NULL) receives the prefix length found, *queued_chunks (may be NULL) how
 * many of those were not in T0 yet and are on their way. KDN_ERR_UNSUPPORTED when the device has
 * no T0 (tier.gpu.bytes = 0) or kdnd is older than protocol minor 5. Added in ABI minor 4. */
KDN_API int kdn_gpu_prefetch(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n_tokens,
                             kdn_gpu_kv* kv, uint32_t* cached_chunks, uint32_t* queued_chunks);

/* Whether the copies of every kdn_gpu_retrieve and kdn_gpu_segment_retrieve of `kv` since the
 * last kdn_gpu_check landed whole. Those calls return once kdnd has queued the copies, and a copy
 * can still fail on the device after that (a broken device or context): the done event fires all
 * the same and the blocks then hold bytes kdnd did not write. This call waits on the host until
 * the copies have landed (call it after the engine's stream waited on the done event, or before
 * the step that reads the KV): KDN_OK if they landed whole, KDN_ERR_IO if one failed (recompute
 * what those retrieves loaded), KDN_ERR_UNSUPPORTED for a kdnd older than protocol minor 5.
 * Added in ABI minor 4. */
KDN_API int kdn_gpu_check(kdn_client* client, kdn_gpu_kv* kv);

#define KDN_BLEND_PLANE_K 0u
#define KDN_BLEND_PLANE_V 1u
KDN_API int kdn_gpu_blend_select(kdn_client* client, const kdn_model* model, const kdn_segment* segs, size_t n_segs,
                                 const int64_t* target_pos, kdn_gpu_kv* kv, const kdn_engine_layout* dst,
                                 uint32_t check_layer, uint32_t plane, double ratio, int32_t* selected,
                                 uint32_t capacity, uint32_t* n_selected, uint32_t* n_compared);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDN_KDN_H_ */
