"""The length of an Ogg Vorbis file from its page headers, without decoding it.

An epoch's batches are planned from every sequence's number of feature frames, which follows from the
number of samples. libsndfile (``soundfile.info``) gets that number by setting up the whole Vorbis decoder
(its codebooks), about 0.7 ms a file, which made the first epoch of an OggZip corpus wait for its plan.
The Ogg container says it more cheaply: the granule position of a Vorbis stream's last page is the number
of samples decoded up to its end, and the identification packet on the first page gives the channels and
the rate. Walking the page headers costs microseconds.

Only a plain Vorbis stream is read here (one logical stream, its first page the identification packet);
anything else returns None and the caller asks libsndfile. A Vorbis stream that starts at a non-zero
granule (cut out of a longer stream) would be counted long: the decoder's check of the sample count
(``OggZipDataset._compute_features``) reports such a file by name.
"""
from __future__ import annotations

import struct

_PAGE = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, page no, CRC, segments
_VORBIS_ID = b"\x01vorbis"
_BEGIN = 0x02  # the page flag of a stream's first page


def vorbis_length(data: bytes) -> tuple[int, int, int] | None:
    """``(samples, rate, channels)`` of an Ogg Vorbis file, or None where the bytes are not one."""
    if not data.startswith(b"OggS") or len(data) < _PAGE.size:
        return None
    pos, serial, granule, first = 0, None, -1, True
    while pos < len(data):
        if len(data) - pos < _PAGE.size:
            return None
        capture, version, flags, page_granule, page_serial, _, _, segments = _PAGE.unpack_from(data, pos)
        if capture != b"OggS" or version != 0:
            return None
        body = pos + _PAGE.size + segments
        end = body + sum(data[pos + _PAGE.size:body])
        if end > len(data):
            return None  # truncated: libsndfile says what is wrong
        if first:
            head = data[body:body + 16]
            if not head.startswith(_VORBIS_ID) or len(head) < 16:
                return None
            channels, rate = head[11], struct.unpack_from("<I", head, 12)[0]
            serial, first = page_serial, False
        elif page_serial != serial or flags & _BEGIN:
            return None  # multiplexed or chained streams
        if page_granule != -1:  # -1: no packet ends on this page
            granule = page_granule
        pos = end
    if granule < 0 or rate == 0:
        return None
    return granule, rate, channels
