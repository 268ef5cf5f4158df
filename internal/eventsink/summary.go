package eventsink

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// maxExamples bounds Summary.Examples, which is for a reader, not a count.
const maxExamples = 10

// Summary is what a record says about the delivery promise.
type Summary struct {
	// Deliveries counts the deliveries with a valid envelope, whatever
	// they were answered; Rejected those answered 400 or 401; Failed the
	// valid ones not answered 2xx (faults, and senders that gave up).
	Deliveries int `json:"deliveries"`
	Rejected   int `json:"rejected"`
	Failed     int `json:"failed"`
	// Acknowledged counts distinct event ids answered 2xx at least once;
	// Unacknowledged those delivered but never answered 2xx.
	Acknowledged   int `json:"acknowledged"`
	Unacknowledged int `json:"unacknowledged"`
	// Duplicates counts events acknowledged more than once: allowed.
	Duplicates int `json:"duplicates"`
	// OutOfOrder counts deliveries whose sequence is lower than one
	// delivered earlier on their stream.
	OutOfOrder int `json:"out_of_order"`
	// Gaps counts events acknowledged for the first time while the
	// previous sequence of their stream had not been acknowledged, the
	// first event seen of each stream excepted (a stream may begin above
	// 1 when events were turned on during its life).
	Gaps int `json:"gaps"`
	// Concurrent counts events two of whose deliveries overlapped:
	// one arrived before another had been answered.
	Concurrent int `json:"concurrent"`
	// Streams counts the streams seen.
	Streams int `json:"streams"`
	// LagP50Ms and LagMaxMs are the lag of each acknowledged event, from
	// its occurred_at to the arrival of its first acknowledged delivery,
	// in milliseconds (the sink's clock against the sender's).
	LagP50Ms float64 `json:"lag_p50_ms"`
	LagMaxMs float64 `json:"lag_max_ms"`
	// ByType counts acknowledged events by type.
	ByType map[string]int `json:"by_type"`
	// OK is true when OutOfOrder, Gaps and Concurrent are 0.
	OK bool `json:"ok"`
	// Examples describes the first offences, for a reader.
	Examples []string `json:"examples,omitempty"`
}

// streamPos is what the analysis knows of one stream so far.
type streamPos struct {
	first int64 // the sequence of its first delivery
	max   int64 // the highest sequence delivered
	acked map[int64]bool
}

// eventPos is what the analysis knows of one event so far.
type eventPos struct {
	acks int
	// until is the latest answer of the event's deliveries so far.
	until time.Time
	// concurrent is set once two of its deliveries overlapped.
	concurrent bool
}

// Summarize analyses a record. It orders the deliveries by arrival (a
// record is written in the order deliveries were answered) and reads them
// as the receiver saw them. It does not change record.
func Summarize(record []Delivery) Summary {
	ds := slices.Clone(record)
	slices.SortStableFunc(ds, func(a, b Delivery) int { return a.Arrived.Compare(b.Arrived) })

	s := Summary{ByType: map[string]int{}}
	streams := map[string]*streamPos{}
	events := map[string]*eventPos{}
	var lags []time.Duration
	example := func(format string, args ...any) {
		if len(s.Examples) < maxExamples {
			s.Examples = append(s.Examples, fmt.Sprintf(format, args...))
		}
	}
	for _, d := range ds {
		if !d.Verified() {
			s.Rejected++
			continue
		}
		s.Deliveries++
		if !d.Acknowledged() {
			s.Failed++
		}

		st := streams[d.Stream]
		if st == nil {
			st = &streamPos{first: d.Sequence, max: d.Sequence, acked: map[int64]bool{}}
			streams[d.Stream] = st
		}
		if d.Sequence < st.max {
			s.OutOfOrder++
			example("out of order: %s sequence %d (event %s) after %d", d.Stream, d.Sequence, d.WebhookID, st.max)
		}
		st.max = max(st.max, d.Sequence)

		ev := events[d.WebhookID]
		if ev == nil {
			ev = &eventPos{}
			events[d.WebhookID] = ev
		} else if d.Arrived.Before(ev.until) {
			if !ev.concurrent {
				s.Concurrent++
				example("concurrent: event %s arrived at %s, before an earlier delivery was answered at %s",
					d.WebhookID, d.Arrived.Format(time.RFC3339Nano), ev.until.Format(time.RFC3339Nano))
			}
			ev.concurrent = true
		}
		if d.Answered.After(ev.until) {
			ev.until = d.Answered
		}

		if !d.Acknowledged() {
			continue
		}
		ev.acks++
		if ev.acks > 1 {
			if ev.acks == 2 {
				s.Duplicates++
			}
			continue
		}
		if d.Sequence != st.first && !st.acked[d.Sequence-1] {
			s.Gaps++
			example("gap: %s sequence %d (event %s) acknowledged before %d was", d.Stream, d.Sequence, d.WebhookID, d.Sequence-1)
		}
		st.acked[d.Sequence] = true
		s.ByType[d.Type]++
		if !d.OccurredAt.IsZero() {
			lags = append(lags, d.Arrived.Sub(d.OccurredAt))
		}
	}

	s.Streams = len(streams)
	for _, ev := range events {
		if ev.acks > 0 {
			s.Acknowledged++
		} else {
			s.Unacknowledged++
		}
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		// The nearest-rank median: the lower middle of an even count.
		s.LagP50Ms = millis(lags[(len(lags)-1)/2])
		s.LagMaxMs = millis(lags[len(lags)-1])
	}
	s.OK = s.OutOfOrder == 0 && s.Gaps == 0 && s.Concurrent == 0
	return s
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}
