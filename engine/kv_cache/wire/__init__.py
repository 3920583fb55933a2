"""KV block wire format: one layer's K and V for a token range, as one self-checking frame.

A prefill worker streams Layer Blocks (one layer of one block: `[1, tokens, bytes]`) and the decode worker
assembles them into Full Blocks (`[layer, tokens, bytes]`). A frame carries one layer's K and V for a
token range: one block, or (version 2) a run of that layer's consecutive blocks, so a layer's KV travels
as one frame whatever the block size. Its bytes: a 64-byte header in network byte order, the payload (the
tensor's bytes in C order, for a KV cache layer slice `[2, tokens, kv_heads, head_dim]`, K then V), then
zero padding to a multiple of 64 bytes, so frames laid end to end keep every header and payload 64-byte
aligned (what shared-memory rings and RDMA regions need).

    offset  width  field
    ------  -----  ----------------------------------------------------------------------
         0      4  magic             b"AKVB"
         4      2  version           u16, FORMAT_VERSION (2); READABLE_VERSIONS are accepted
         6      1  dtype             u8: 1 float32, 2 float16, 3 bfloat16, 4 float64, 5 int8, 6 uint8,
                                     7 float8_e4m3fn, 8 float8_e5m2
         7      1  checksum kind     u8: 1 CRC32C (Castagnoli), 2 CRC32 (IEEE, zlib)
         8      4  layer             u32 layer index
        12      4  token start       u32 position of the first token
        16      4  token end         u32 one past the last token
        20      1  ndim              u8, 1..4
        21      3  reserved          zero
        24      8  block hash        u64 chained hash (engine.kv_cache.manager.hash_block_tokens) of the
                                     frame's last block, which names every block before it too
        32     16  shape             4 x u32, zero past ndim
        48      8  payload length    u64 bytes, = product(shape) x dtype size
        56      4  payload checksum  u32 over the payload bytes (not the padding)
        60      4  header checksum   u32 CRC32 over bytes 0..59
        64      n  payload
      64+n      p  zero padding, p = -n mod 64

Versions: 1, one block per frame; 2, a run of consecutive blocks per frame, hashed by its last block (a
one-block frame reads the same in both, so version 1 frames are still accepted).

Checks run cheapest first: magic, version (before anything whose layout a newer version may change),
header checksum, then shape against the payload length and the receiver's expected shape, then the
payload checksum. CRC32C is used when the `crc32c` package is installed (hardware CRC instructions), else
zlib's CRC32; the frame names the one it carries. Both sides compute the payload checksum in strides of
`CHECKSUM_STRIDE` bytes as they copy (same value as one pass), each stride while it is still in cache.
"""

from engine.kv_cache.wire.codec import (
    EncodedFrame,
    KVBlock,
    check_destination,
    coalesce,
    decode,
    decode_into,
    decode_payload,
    encode,
    encode_into,
    header_for,
    layer_runs,
)
from engine.kv_cache.wire.header import (
    ALIGNMENT,
    CHECKSUMS,
    CODE_DTYPES,
    DEFAULT_CHECKSUM,
    DTYPE_CODES,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_NDIM,
    READABLE_VERSIONS,
    BadChecksum,
    BadHeader,
    BadMagic,
    BadShape,
    ChecksumKind,
    ExpectedShape,
    FrameHeader,
    KVWireError,
    TruncatedFrame,
    UnsupportedVersion,
    WireCounters,
    check_shape,
    frame_nbytes,
    kv_layer_shape,
    padded,
    parse_header,
    payload_nbytes,
)
from engine.kv_cache.wire.payload import (
    CHECKSUM_STRIDE,
    PayloadSink,
    checksum_of,
    destination_segments,
    source_segments,
    tensor_bytes,
)

__all__ = [
    "ALIGNMENT", "CHECKSUMS", "CHECKSUM_STRIDE", "CODE_DTYPES", "DEFAULT_CHECKSUM", "DTYPE_CODES", "FORMAT_VERSION",
    "HEADER_SIZE", "MAGIC", "MAX_NDIM", "READABLE_VERSIONS", "BadChecksum", "BadHeader", "BadMagic", "BadShape",
    "ChecksumKind", "EncodedFrame", "ExpectedShape", "FrameHeader", "KVBlock", "KVWireError", "PayloadSink",
    "TruncatedFrame", "UnsupportedVersion", "WireCounters", "check_destination", "check_shape", "checksum_of",
    "coalesce", "decode", "decode_into", "decode_payload", "destination_segments", "encode", "encode_into",
    "frame_nbytes", "header_for", "kv_layer_shape", "layer_runs", "padded", "parse_header", "payload_nbytes",
    "source_segments", "tensor_bytes",
]
