"""The trainer's side of the reward service: a `Reward` that scores over HTTP with timeouts and retries.

Samples travel in requests of at most `max_request_images`; each request is retried on a timeout, a
refused connection or a server error (HTTP 5xx), with exponential back-off. A request that still
fails marks its samples invalid with a line naming the server and the fix, so a slow or failing
reward costs those samples, not the run; nothing is dropped without a mark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from spotlight.http_fetch import FetchError, fetch
from spotlight.rewards.base import Metadata, RewardOutput
from spotlight.rewards.server.wire import WireError, decode_output, encode_request


class RequestFailed(RuntimeError):
    """One request failed; `retry` says whether sending it again may help."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class HTTPReward:
    """A Reward served by `spotlight serve-reward` at `url` (e.g. http://127.0.0.1:8765).

    timeout_s bounds each attempt as a whole (connect, send, wait, read: a server that drips its answer
    cannot stretch it); retries is the number of attempts after the first; concurrency is the number of
    requests in flight at once (the server merges them into batches); an answer larger than
    max_response_bytes is refused unread. A request carries at most max_request_images images and
    about max_request_bytes of encoded pixels, whichever is fewer (at least one image).
    """

    uses_metadata = True  # passed on to the server when the prompts have it
    requires_metadata = False

    def __init__(self, url: str, name: str = "http", timeout_s: float = 60.0, retries: int = 2,
                 backoff_s: float = 0.5, max_request_images: int = 64, concurrency: int = 4,
                 max_response_bytes: int = 16 * 1024 * 1024, max_request_bytes: int = 32 * 1024 * 1024) -> None:
        if timeout_s <= 0 or retries < 0 or max_request_images < 1 or concurrency < 1:
            raise ValueError("HTTPReward needs timeout_s > 0, retries >= 0, max_request_images >= 1 and "
                             f"concurrency >= 1 (got {timeout_s}, {retries}, {max_request_images}, {concurrency})")
        self.url = url.rstrip("/")
        self.name = name
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_request_images = max_request_images
        self.concurrency = concurrency
        self.max_response_bytes = max_response_bytes
        self.max_request_bytes = max_request_bytes

    def _post(self, body: bytes, batch: int) -> RewardOutput:
        """One attempt; raises RequestFailed saying whether a retry may help."""
        try:
            response = fetch(f"{self.url}/score", method="POST", body=body,
                             headers={"Content-Type": "application/json"}, deadline_s=self.timeout_s,
                             max_body_bytes=self.max_response_bytes)
        except FetchError as error:
            raise RequestFailed(f"reward server {self.url} unreachable or slower than {self.timeout_s:g} s "
                                f"({error}); is `spotlight serve-reward` running there?", retry=True) from None
        if response.status != 200:
            detail = " ".join(response.body.decode(errors="replace").split())[:200]
            raise RequestFailed(f"HTTP {response.status} from {self.url}: {detail}",
                                retry=response.status >= 500 or response.status in (408, 429)) from None
        try:
            return decode_output(json.loads(response.body), batch)
        except (WireError, ValueError) as error:
            raise RequestFailed(f"bad response from {self.url}: {error}", retry=False) from None

    def _score_request(self, images: torch.Tensor, prompts: list[str],
                       metadata: list[Metadata] | None = None) -> RewardOutput:
        """Score one request with retries; on final failure every sample is invalid, with the reason."""
        body = json.dumps(encode_request(images, prompts, metadata)).encode()
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._post(body, len(prompts))
            except RequestFailed as error:
                failure = str(error)
                if not error.retry:
                    break
        batch = len(prompts)
        errors = [f"sample {i} ({prompt!r}): {failure} (after {attempt + 1} attempts)"
                  for i, prompt in enumerate(prompts)]
        return RewardOutput(torch.zeros(batch), torch.zeros(batch, dtype=torch.bool),
                            torch.zeros(batch, dtype=torch.bool), errors)

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """Rewards of images (B, 3, H, W) in [0, 1]; samples of failed requests come back valid=False."""
        prompts = list(prompts)
        if images.shape[0] != len(prompts):
            raise ValueError(f"got {images.shape[0]} images but {len(prompts)} prompts; pass one per image")
        records = None if metadata is None else list(metadata)
        # large images (1024 px: 4 MiB of base64 each) would overflow the server's body limit at 64 per request
        encoded_bytes = 4 * images[0].numel() // 3 + 1 if len(prompts) else 1
        step = max(1, min(self.max_request_images, self.max_request_bytes // encoded_bytes))
        starts = list(range(0, len(prompts), step))
        chunks = [(images[start : start + step], prompts[start : start + step],
                   None if records is None else records[start : start + step]) for start in starts]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(chunks)))) as pool:
            outputs = list(pool.map(lambda chunk: self._score_request(*chunk), chunks))
        errors = []
        for start, out in zip(starts, outputs, strict=True):
            errors += [shift_sample_index(line, start) for line in out.errors]
        # a failed request has no terms: its samples are invalid, so zeros stand in for them
        names = list(dict.fromkeys(term for out in outputs for term in out.terms))
        terms = {term: torch.cat([out.terms.get(term, torch.zeros(out.rewards.shape[0])) for out in outputs])
                 for term in names}
        return RewardOutput(
            torch.cat([out.rewards for out in outputs]) if outputs else torch.zeros(0),
            torch.cat([out.strict for out in outputs]) if outputs else torch.zeros(0, dtype=torch.bool),
            torch.cat([out.valid for out in outputs]) if outputs else torch.zeros(0, dtype=torch.bool),
            errors, terms,
        )


def shift_sample_index(line: str, offset: int) -> str:
    """'sample i ...' of a request as 'sample offset+i ...' of the whole batch (other lines unchanged)."""
    words = line.split(" ", 2)
    if len(words) == 3 and words[0] == "sample" and words[1].isdigit():
        return f"sample {int(words[1]) + offset} {words[2]}"
    return line
