"""How many bytes each pair of ranks reserves for the next exchange round
(exchange.py), so that a round needs no collective to tell its sizes.

all_to_all_single needs, on both ranks of a pair, the size of what one
sends the other. A round's sizes would take a collective of their own
before each step (ids asked, then answers); instead both ranks of a pair
derive the room of each step from what they both saw on that pair in the
rounds before, the same rule on both sides:

- ids: twice the ids asked on the pair in its last round with any, or
  half the room before if that is more (a window's count varies round to
  round); a round that asks nothing of the pair (a closing round, a rank
  whose rows ran out) leaves the room as it was, so that an epoch's end
  does not shrink the next epoch's first room;
- answers: the ids asked in this round (both know them after step 1)
  times the bytes per row of the pair's last answer, plus 1/16 (rows of a
  dataset mostly have one size), but no more than four times the larger
  of the pair's last two answers (a round of a few large rows before one
  of many small ones would otherwise reserve many times what is sent; the
  larger of two, so that a short last round of an epoch, a few rows, does
  not cap the next epoch's full first round), plus ANSWER_SLACK bytes.
  Where the pair's last two answers had the same bytes per row within
  1/256 (rows of one shape: arrays, not encoded images), 1/256 and 8
  bytes a row (a row's share of the description varies with its id)
  replace the 1/16: every room byte is sent, and 1/16 of a 3 MB answer
  is 190 KB of zeros over the wire each round.

What does not fit travels in one more all_to_all_single, sized by the
headers the step carried (exchange.py: every rank tells every rank
whether it has such a remainder, so all ranks agree on making that call);
a wrong guess costs a call, never a row. Not thread-safe: one round at a
time (RowExchange).
"""

from __future__ import annotations

from .packing import aligned

__all__ = ["ANSWER_SLACK", "PairSizes"]

ANSWER_SLACK = 1024

# A pair's last two answers with rows, (bytes, rows) each, the last first.
_Answered = tuple[tuple[int, int], tuple[int, int]]


class PairSizes:
    """Rooms per peer rank of one rank: ids_out[r] (ids this rank may send
    r in step 1), ids_in[r] (ids r may send it); the last two answers with
    rows of this rank to r (answered_out[r]: (bytes, rows) of the last,
    then of the one before) and of r to it (answered_in[r])."""

    def __init__(self, world: int) -> None:
        self.ids_out = [0] * world
        self.ids_in = [0] * world
        self.answered_out: list[_Answered] = [((0, 0), (0, 0))] * world
        self.answered_in: list[_Answered] = [((0, 0), (0, 0))] * world

    @staticmethod
    def _room(n: int, answered: _Answered) -> int:
        (nbytes, rows), (before, before_rows) = answered
        if n == 0 or rows == 0:
            return 0
        per_row = -(-nbytes // rows)
        if before_rows and abs(per_row - before // before_rows) * 256 <= per_row:
            margin = n * (per_row // 256 + 8)   # one size: see the module
        else:
            margin = n * per_row // 16
        guess = min(n * per_row + margin, 4 * max(nbytes, before))
        return aligned(guess + ANSWER_SLACK)

    def answers_out(self, asked_of_me: list[int]) -> list[int]:
        """Bytes reserved for this rank's answer to each rank, which asked
        it asked_of_me[r] ids this round."""
        return [self._room(n, last) for n, last in zip(asked_of_me, self.answered_out)]

    def answers_in(self, asked_by_me: list[int]) -> list[int]:
        """Bytes reserved for each rank's answer to this rank."""
        return [self._room(n, last) for n, last in zip(asked_by_me, self.answered_in)]

    def after_requests(self, asked_by_me: list[int], asked_of_me: list[int]) -> None:
        """Step 1 done (every round, the last included): the ids rooms of
        the next round."""
        self.ids_out = [_ids_room(n, room) for n, room in zip(asked_by_me, self.ids_out)]
        self.ids_in = [_ids_room(n, room) for n, room in zip(asked_of_me, self.ids_in)]

    def after_answers(self, asked_of_me: list[int], sent: list[int],
                      asked_by_me: list[int], got: list[int]) -> None:
        """Step 2 done: each pair's answer (bytes) and its rows (ids asked),
        kept where there were any."""
        self.answered_out = [((b, n), last[0]) if n else last for n, b, last
                             in zip(asked_of_me, sent, self.answered_out)]
        self.answered_in = [((b, n), last[0]) if n else last for n, b, last
                            in zip(asked_by_me, got, self.answered_in)]


def _ids_room(asked: int, room: int) -> int:
    return max(2 * asked, room // 2) if asked else room
