"""Drawing one Pathfinder image: two target contours, distractors and two markers.

In the spirit of Linsley et al. 2018 ("Learning long-range spatial dependencies with
horizontal gated recurrent units", NeurIPS) and the `drewlinsley/pathfinder` snakes2
generator used by LRA: a contour is a chain of short dashes ("paddles") whose heading
turns by a bounded random angle from dash to dash. Contours never touch each other or
themselves (a clear gap is enforced on a pixel grid), so whether the two markers lie on
one contour is well defined. Rendered with 4x supersampling for anti-aliasing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image, ImageDraw

_SUPERSAMPLE = 4


@dataclasses.dataclass(frozen=True)
class SnakeParams:
    """Geometry of one resolution/difficulty, lengths in output pixels.

    Attributes:
        resolution: image side R.
        contour_length: paddles per target contour (6, 9 or 14).
        paddle_length: length of one dash.
        paddle_margin: gap between consecutive dashes.
        paddle_width: stroke width.
        marker_radius: radius of the two endpoint disks.
        max_turn: largest heading change between dashes, radians.
        gap: cells of clearance kept around every contour (collision grid).
    """

    resolution: int
    contour_length: int
    paddle_length: float
    paddle_margin: float
    paddle_width: float
    marker_radius: float
    max_turn: float
    gap: int

    @property
    def distractor_length(self) -> int:
        return max(1, self.contour_length // 3)

    @property
    def num_distractors(self) -> int:
        # LRA: num_distractor_snakes = 20 // distractor_length at 32x32.
        return 20 // self.distractor_length

    @classmethod
    def for_resolution(cls, resolution: int, contour_length: int) -> SnakeParams:
        u = resolution / 32
        return cls(resolution, contour_length, paddle_length=2.0 * u, paddle_margin=1.0 * u,
                   paddle_width=max(1.0, 0.6 * u), marker_radius=1.5 * u, max_turn=np.pi / 5,
                   gap=max(1, round(u)))


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    out = mask.copy()
    r = mask.shape[0]
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            ys, yd = slice(max(0, -dy), r - max(0, dy)), slice(max(0, dy), r - max(0, -dy))
            xs, xd = slice(max(0, -dx), r - max(0, dx)), slice(max(0, dx), r - max(0, -dx))
            out[yd, xd] |= mask[ys, xs]
    return out


def _shapes(rng: np.random.Generator, p: SnakeParams, n: int, batch: int) -> tuple:
    """`batch` random contours of `n` dashes at the origin: (starts, dirs, sample points)."""
    turns = rng.uniform(-p.max_turn, p.max_turn, (batch, n))
    turns[:, 0] = rng.uniform(0, 2 * np.pi, batch)
    heading = np.cumsum(turns, 1)
    dirs = np.stack([np.cos(heading), np.sin(heading)], -1)
    stride = dirs * (p.paddle_length + p.paddle_margin)
    starts = np.cumsum(stride, 1) - stride
    t = np.linspace(0.0, 1.0, max(3, int(np.ceil(p.paddle_length * 2)) + 1))
    pts = starts[:, :, None, :] + t[None, None, :, None] * p.paddle_length * dirs[:, :, None, :]
    return starts, dirs, pts.reshape(batch, -1, 2)


def _self_clear(p: SnakeParams, starts: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """bool [batch]: non-adjacent dashes of each contour stay `gap + 1` apart.

    Checked on the dash start, middle and end points only: the raster test against other
    contours is the exact one, this only rejects contours that curl onto themselves.
    """
    n = starts.shape[1]
    if n <= 2 or starts.shape[0] == 0:
        return np.ones(starts.shape[0], bool)
    pts = starts[:, :, None, :] + np.array([0.0, 0.5, 1.0])[None, None, :, None] * (
        p.paddle_length * dirs[:, :, None, :])
    pts = pts.reshape(starts.shape[0], -1, 2)
    dash = np.arange(n).repeat(3)
    far = np.abs(dash[:, None] - dash[None, :]) >= 2
    dist2 = ((pts[:, :, None, :] - pts[:, None, :, :]) ** 2).sum(-1)
    return np.where(far, dist2, np.inf).min((1, 2)) >= (p.gap + 1) ** 2


def _grow(
    rng: np.random.Generator, p: SnakeParams, num_paddles: int, blocked: np.ndarray,
    end_blocked: np.ndarray | None = None, batches: int = 6,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray] | None:
    """One contour placed clear of `blocked` (bool [R, R]); None if none fits.

    `end_blocked` (optional bool [R, R]) must additionally stay clear of the contour's
    last point, where a marker may go.

    Shapes (heading random walks) are drawn first, those whose bounding box fits the
    frame are kept, and for each of them every integer translation that stays off
    `blocked` is found at once and one is picked uniformly. Growing in place from a
    random start instead runs into the border or other contours most of the time.
    """
    r, lo = p.resolution, p.marker_radius + 0.5
    room = r - 2 * lo - 1  # a random sub-pixel offset of up to 1 is added below
    for attempt in range(batches):
        # Small first batches: short contours almost always fit at the first try.
        starts, dirs, pts = _shapes(rng, p, num_paddles, 16 << attempt)
        low, high = pts.min(1), pts.max(1)
        fits = np.flatnonzero((high - low < room).all(1))
        fits = fits[_self_clear(p, starts[fits], dirs[fits])]
        for b in fits:
            q = pts[b] - low[b] + lo + rng.uniform(0, 1, 2)
            span = np.floor(r - lo - q.max(0)).astype(int)  # shifts 0..span-1 stay inside
            ij = np.floor(q).astype(np.int64)
            flat = np.unique(ij[:, 1] * r + ij[:, 0])
            free = np.ones((span[1], span[0]), bool)
            for cy, cx in zip(*np.divmod(flat, r)):
                free &= ~blocked[cy:cy + span[1], cx:cx + span[0]]
            if end_blocked is not None:
                ex, ey = ij[-1]
                free &= ~end_blocked[ey:ey + span[1], ex:ex + span[0]]
            choices = np.flatnonzero(free)
            if choices.size == 0:
                continue
            sy, sx = divmod(int(rng.choice(choices)), span[0])
            mask = np.zeros((r, r), bool)
            mask.flat[flat + sy * r + sx] = True
            s0 = starts[b] + (q[0] - pts[b][0] + np.array([sx, sy]))
            return list(zip(s0, s0 + p.paddle_length * dirs[b])), mask
    return None


def draw(rng: np.random.Generator, p: SnakeParams, label: int, max_tries: int = 200) -> np.ndarray:
    """One grayscale Pathfinder image.

    Args:
        rng: numpy generator (the only source of randomness).
        p: geometry.
        label: 1 = markers on the two ends of one contour, 0 = on ends of two contours.
        max_tries: whole-image restarts before giving up.

    Returns:
        uint8 [R, R] image, background 0, strokes and markers up to 255.

    Raises:
        RuntimeError: if no layout fits in `max_tries` restarts (geometry too crowded).

    Example:
        >>> img = draw(np.random.default_rng(0), SnakeParams.for_resolution(32, 14), 1)
        >>> img.shape, img.dtype.name
        ((32, 32), 'uint8')
    """
    r = p.resolution
    for _ in range(max_tries):
        blocked = np.zeros((r, r), bool)
        contours, masks = [], []
        for n in [p.contour_length] * 2 + [p.distractor_length] * p.num_distractors:
            end_blocked = None
            if len(contours) == 1:
                # The second target must leave room for the markers (see _markers_clear).
                a_start, a_end = contours[0][0][0], contours[0][-1][1]
                near = p.marker_radius + p.gap
                blocked = blocked | _disks([a_start, a_end], near, r)
                end_blocked = _disks([a_start], near + p.marker_radius + 1, r) | _dilate(
                    masks[0], int(np.ceil(near)))
            grown = _grow(rng, p, n, blocked, end_blocked)
            if grown is None:
                break
            contours.append(grown[0])
            masks.append(grown[1])
            blocked |= _dilate(grown[1], p.gap)
            if len(contours) == 2:
                ends = _marker_ends(contours, label)
                if not _markers_clear(p, ends, masks, label):
                    break
                # Reserve the marker disks before distractors are placed.
                blocked |= _disks(ends, p.marker_radius + 2 * p.gap, r)
        else:
            return _render(p, contours, _marker_ends(contours, label))
    raise RuntimeError(
        f"pathfinder: no layout found in {max_tries} tries for resolution {r}, "
        f"contour_length {p.contour_length}"
    )


def _marker_ends(contours: list, label: int) -> list[np.ndarray]:
    first, second = contours[0], contours[1]
    return [first[0][0], first[-1][1] if label == 1 else second[-1][1]]


def _markers_clear(p: SnakeParams, ends: list[np.ndarray], masks: list, label: int) -> bool:
    """A marker must not touch the other target contour, nor (label 0) the other marker:
    either contact would make two contours look joined."""
    r = p.resolution
    others = [masks[1], masks[1] if label == 1 else masks[0]]
    for end, other in zip(ends, others):
        if (_disks([end], p.marker_radius + p.gap, r) & other).any():
            return False
    apart = np.hypot(*(ends[0] - ends[1]))
    return label == 1 or apart >= 2 * p.marker_radius + p.gap + 1


def _disks(centres: list[np.ndarray], radius: float, r: int) -> np.ndarray:
    yy, xx = np.mgrid[0:r, 0:r] + 0.5
    out = np.zeros((r, r), bool)
    for c in centres:
        out |= (xx - c[0]) ** 2 + (yy - c[1]) ** 2 <= radius**2
    return out


def _render(p: SnakeParams, contours: list, ends: list[np.ndarray]) -> np.ndarray:
    s = _SUPERSAMPLE
    canvas = Image.new("L", (p.resolution * s, p.resolution * s), 0)
    pen = ImageDraw.Draw(canvas)
    width = max(1, round(p.paddle_width * s))
    for paddles in contours:
        for a, b in paddles:
            pen.line([tuple(a * s), tuple(b * s)], fill=255, width=width)
    for c in ends:
        x, y, rad = c[0] * s, c[1] * s, p.marker_radius * s
        pen.ellipse([x - rad, y - rad, x + rad, y + rad], fill=255)
    return np.asarray(canvas.resize((p.resolution, p.resolution), Image.Resampling.BOX))
