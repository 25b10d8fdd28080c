package probes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"
)

// probeSends is how many times a probe with no handshake (ARP, NDP, ICMP
// echo, UDP, broadcast) sends its request within its deadline: one loss
// must not read as "blocked".
const probeSends = 3

// errCancelled is what resender.run wraps ctx's error in when ctx was
// cancelled (not merely past its deadline): the message reads "cancelled: "
// and ctx's error, as the probes have always reported it.
var errCancelled = errors.New("cancelled")

// A resender paces a request that may be lost: up to probeSends sends,
// spread evenly over the time left to ctx's deadline, and between them reads
// that wake when the next send is due.
type resender struct {
	ctx      context.Context
	deadline time.Time // when run gives up; linger may bring it forward
	interval time.Duration
	sent     int  // requests that left
	quiet    bool // no more sends: an answer is in, run only listens on
}

// newResender starts the pacing from now to ctx's deadline.
func newResender(ctx context.Context) *resender {
	deadline := deadlineOf(ctx)
	return &resender{ctx: ctx, deadline: deadline, interval: time.Until(deadline) / probeSends}
}

// run sends and reads until recv reports the exchange done (true, nil), the
// deadline passes (false, nil), ctx is cancelled (errCancelled) or send or
// recv returns an error (that error).
//
// send sends the request once; seq is how many requests left before it. It
// reports whether the request left: false with a nil error is an attempt
// that ends nothing, is not counted and is tried again an interval later.
//
// recv sets the socket's read deadline to wake (the next send, or the
// deadline) and reads at most once: a timeout is not an error, run decides
// what comes next.
//
// setReadDeadline is the socket's, so that cancelling ctx wakes a blocked
// read.
func (r *resender) run(setReadDeadline func(time.Time) error, send func(seq int) (bool, error), recv func(wake time.Time) (bool, error)) (bool, error) {
	defer wakeOnCancel(r.ctx, setReadDeadline)()
	var next time.Time
	for {
		now := time.Now()
		if !now.Before(r.deadline) {
			return false, nil
		}
		if err := r.ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return false, fmt.Errorf("%w: %w", errCancelled, err)
		}
		if r.sending() && !now.Before(next) {
			ok, err := send(r.sent)
			if err != nil {
				return false, err
			}
			if ok {
				r.sent++
			}
			next = now.Add(r.interval)
		}
		wake := r.deadline
		if r.sending() && next.Before(wake) {
			wake = next
		}
		if done, err := recv(wake); done || err != nil {
			return done, err
		}
	}
}

func (r *resender) sending() bool { return r.sent < probeSends && !r.quiet }

// linger stops the sends and keeps listening for at most d more (never past
// the deadline): the request has been answered, more answers may follow.
func (r *resender) linger(d time.Duration) {
	r.quiet = true
	if l := time.Now().Add(d); l.Before(r.deadline) {
		r.deadline = l
	}
}

// echoes collects the answers to a request sent to many hosts at once (a
// broadcast or a multicast group).
type echoes struct {
	from  map[netip.Addr]bool
	first []byte // the first answer's payload
}

// add counts an answer from a host that is not us. The first one ends the
// sends and gives the others multicastLinger to answer.
func (e *echoes) add(r *resender, from netip.Addr, payload []byte) {
	if e.from == nil {
		e.from = map[netip.Addr]bool{}
		e.first = append([]byte(nil), payload...)
		r.linger(multicastLinger)
	}
	e.from[from] = true
}

// fill names every responder in obs, the first in sort order as From, and
// the first answer as Reply.
func (e *echoes) fill(obs *Observation) {
	for a := range e.from {
		obs.Evidence.Responders = append(obs.Evidence.Responders, a.String())
	}
	sort.Strings(obs.Evidence.Responders)
	obs.Evidence.From = obs.Evidence.Responders[0]
	obs.Evidence.Reply = printable(e.first, 200)
}
