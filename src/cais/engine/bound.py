"""A strict bound on bytes in flight, granted in request order.

Real memory systems bound what an issuer keeps outstanding by a fixed number of
tracking entries (MSHRs, request tables): a request that finds them full waits, and
waiting requests are served first come, first served. :class:`Bound` is that, in
bytes: nothing is ever admitted past the limit, not even a first request, so a
caller must cut its requests to at most ``limit`` bytes each.

:class:`Bound` (at most ``limit`` bytes outstanding; ``acquire`` grants in FIFO
order, ``release`` gives back) is compiled (``rust/src/wait.rs``): every remote
request a TB makes takes and gives back its bytes."""

from cais._core import Bound

__all__ = ["Bound"]
