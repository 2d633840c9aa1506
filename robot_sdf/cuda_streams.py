"""The torch CUDA streams robot_sdf launches its query kernels on, and the work queued there.

Query kernels run on the caller's current torch stream, through a Warp view of it (torch_stream,
cached per stream); world changes (BVH builds and refits) run on Warp's own stream
(warp_torch_stream). queued_work_events tells when everything robot_sdf has queued so far has
run, without a host wait: what lets dropped meshes go (robot_sdf.adoption).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch
import warp as wp

# Warp views of torch streams, most recently used last; bounded (a caller may make a stream per
# call) and locked (service threads look streams up concurrently).
_streams: OrderedDict[tuple[int, int], wp.Stream] = OrderedDict()
_streams_lock = threading.Lock()
STREAM_CACHE_SIZE = 32


def torch_stream(device: torch.device) -> wp.Stream:
    """Warp view of torch's current stream on ``device``, cached per stream handle."""
    ts = torch.cuda.current_stream(device)
    key = (device.index or 0, int(ts.cuda_stream))
    with _streams_lock:
        stream = _streams.get(key)
        if stream is not None:
            _streams.move_to_end(key)
            return stream
        stream = _streams[key] = wp.stream_from_torch(ts)
        while len(_streams) > STREAM_CACHE_SIZE:
            (index, handle), evicted = _streams.popitem(last=False)
            # What robot_sdf queued there may still run: queued_work_events covers it until done.
            event = _event_on(torch.cuda.ExternalStream(handle, device=torch.device("cuda", index)))
            if event is not None:
                _evicted_events.append((index, event))
            # A collected Warp wrapper of an external stream unregisters the stream inside Warp
            # for every wrapper of it (a caller's own included); this one lets go without that.
            evicted.cuda_stream = None
        return stream


# (device index, event) recorded on streams evicted from _streams, until they have completed.
_evicted_events: list = []


def _event_on(stream):
    """An event recorded now on the torch ``stream``, or None while it captures a graph."""
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():
            return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def queued_work_events(device: torch.device) -> tuple | None:
    """Events that complete once every kernel robot_sdf has queued on ``device`` so far has run
    (one per stream it launched on, and those of evicted streams still pending), or None when
    one of those streams captures a graph or the cache changes under this call: the caller then
    synchronises the device."""
    index = device.index or 0
    try:
        handles = {handle for (i, handle) in tuple(_streams) if i == index}
        _evicted_events[:] = [(i, event) for i, event in tuple(_evicted_events) if not event.query()]
        pending = [event for i, event in _evicted_events if i == index]
    except RuntimeError:
        return None
    handles.add(int(torch.cuda.current_stream(device).cuda_stream))
    events = []
    for handle in handles:
        event = _event_on(torch.cuda.ExternalStream(handle, device=device))
        if event is None:
            return None
        events.append(event)
    return tuple(events + pending)


def warp_torch_stream(wdev, device: torch.device) -> torch.cuda.ExternalStream:
    """Warp's current stream on ``wdev`` (where BVH builds and refits run) as a torch stream."""
    return torch.cuda.ExternalStream(wp.get_stream(wdev).cuda_stream, device=device)
