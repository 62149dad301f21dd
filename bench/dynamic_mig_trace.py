"""bench/dynamic_mig.py's trace: a seeded week of MIG demand on a lab's H200s. Pure.

Written down before the benchmark was first run, and not tuned to its result.

The clock: t = 0 is Monday 00:00; days 0-4 are weekdays, 5-6 the weekend. Two
populations arrive, each a Poisson process whose rate is constant within an
hour and follows the week:

- students: notebooks of 1g.18gb or 2g.35gb, each lasting uniform 1-3 h. The
  share of 2g.35gb rises through the week (coursework grows towards Friday's
  deadline): 20 % on Monday to 50 % on Friday, linearly by weekday; 30 % at
  weekends.
- fine-tuners: runs of 3g.71gb or 7g.141gb, each lasting uniform 4-12 h. The
  share of 7g.141gb is 30 % on weekdays and 50 % at weekends (long runs are
  started for the weekend).

How much each population offers, as a share of the pool (GPU-hours of demand
arriving per hour, over the pool's GPUs: 1.0 is arrivals that would keep
every GPU busy if packed perfectly), by the hour of the week:

    students      weekday 09-18: 0.80   weekday 18-23: 0.30
                  weekend 10-20: 0.15   any other hour: 0.02
    fine-tuners   weekday 09-18: 0.30   weekday other hours: 0.90
                  weekend: 1.00

Over a week that is 0.29 (students) + 0.77 (fine-tuners) = 1.05 of the pool,
around its capacity, with daytime student peaks and long night runs. A
request's GPU-time is its compute slices / 7 × its duration (1g = 1/7 of a
GPU, 2g = 2/7, 3g = 3/7, 7g = 1); an hour's arrival rate is its share × the
pool's GPUs / the mean GPU-hours of a request of that population at that
hour's mix. Every request asks for one slice. A request still waiting after
PATIENCE_S (2 h, as gpulease's queue_max_wait can be set) gives up.

A warm-up (the Sunday before, by default) is generated the same way so that
Monday does not start on an empty pool; only the requests arriving within the
measured days count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpulease.core.capacity.dynamic_mig import mig_resource
from gpulease.core.model.device_request import DeviceRequest

HOUR = 3600.0
DAY = 24 * HOUR
MODEL = "H200"
PATIENCE_S = 2 * HOUR
SLICES = {"1g.18gb": 1, "2g.35gb": 2, "3g.71gb": 3, "7g.141gb": 7}  # compute, 7 a GPU
SOLD = tuple(SLICES)  # the profiles the lab sells, smallest first
STUDENT_HOURS = (1.0, 3.0)  # uniform
TUNER_HOURS = (4.0, 12.0)


@dataclass(frozen=True)
class Request:
    id: int
    arrived: float  # s since Monday 00:00 (negative: the warm-up)
    profile: str
    duration: float  # s, from its start
    who: str  # "student" | "tuner"

    @property
    def gpus(self) -> float:
        """Its share of a GPU: compute slices / 7."""
        return SLICES[self.profile] / 7

    @property
    def resource(self) -> str:
        return mig_resource(self.profile)

    def device_request(self) -> DeviceRequest:
        return DeviceRequest(MODEL, self.profile)


def _weekend(day: int) -> bool:
    return day % 7 >= 5


def student_load(day: int, hour: int) -> float:
    if _weekend(day):
        return 0.15 if 10 <= hour < 20 else 0.02
    return 0.80 if 9 <= hour < 18 else 0.30 if 18 <= hour < 23 else 0.02


def tuner_load(day: int, hour: int) -> float:
    if _weekend(day):
        return 1.00
    return 0.30 if 9 <= hour < 18 else 0.90


def student_mix(day: int) -> dict[str, float]:
    """Profile -> share of the students' requests on `day` (0 = Monday)."""
    weekday = day % 7
    big = 0.30 if _weekend(day) else 0.20 + 0.30 * weekday / 4
    return {"1g.18gb": 1 - big, "2g.35gb": big}


def tuner_mix(day: int) -> dict[str, float]:
    big = 0.50 if _weekend(day) else 0.30
    return {"3g.71gb": 1 - big, "7g.141gb": big}


POPULATIONS = {"student": (student_load, student_mix, STUDENT_HOURS),
               "tuner": (tuner_load, tuner_mix, TUNER_HOURS)}


def mean_gpu_hours(mix: dict[str, float], hours: tuple[float, float]) -> float:
    """A request's expected GPU-time (GPU-hours) under `mix`, `hours` uniform."""
    return sum(share * SLICES[p] / 7 for p, share in mix.items()) * sum(hours) / 2


def offered_share(days: float = 7.0) -> dict[str, float]:
    """Each population's mean offered load over `days` from Monday, as a share of the pool."""
    hours = int(days * 24)
    return {who: sum(load(h // 24, h % 24) for h in range(hours)) / hours
            for who, (load, _mix, _hours) in POPULATIONS.items()}


def week_trace(seed: int, gpus: int, days: float, warmup_s: float,
               start_s: float = 0.0, time_scale: float = 1.0) -> list[Request]:
    """Every request arriving from `start_s - warmup_s` to `start_s + days` (s on the week's
    clock), seeded; times and durations are divided by `time_scale` (the real run's
    compression) and shifted so that `start_s` is 0. Sorted by arrival, ids in that order."""
    made: list[tuple[float, str, float, str]] = []
    first, last = start_s - warmup_s, start_s + days * DAY
    for n, (who, (load, mix_of, hours)) in enumerate(sorted(POPULATIONS.items())):
        rng = random.Random(f"dynamic-mig-{seed}-{n}")
        hour = int(first // HOUR)
        while hour * HOUR < last:
            day, of_day = divmod(hour, 24)
            mix = mix_of(day)
            rate = load(day, of_day) * gpus / mean_gpu_hours(mix, hours)  # requests an hour
            t = max(hour * HOUR, first) + rng.expovariate(rate) * HOUR
            while t < min((hour + 1) * HOUR, last):
                profile = rng.choices(list(mix), weights=list(mix.values()))[0]
                made.append((t, profile, rng.uniform(*hours) * HOUR, who))
                t += rng.expovariate(rate) * HOUR
            hour += 1
    made.sort()
    return [Request(i, (t - start_s) / time_scale, profile, duration / time_scale, who)
            for i, (t, profile, duration, who) in enumerate(made)]
