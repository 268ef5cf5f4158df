package eventsink_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"shop/internal/eventsink"
)

var (
	secret      = "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5e}, 32))
	otherSecret = "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x0f}, 32))
)

// start starts a sink that records to a file of the test's.
func start(t *testing.T) (*eventsink.Sink, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "record.jsonl")
	s, err := eventsink.Start(t.Context(), eventsink.Options{Secret: secret, RecordFile: file})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, file
}

// event is the body of the event stream/seq, whose id is its webhook-id.
func event(stream string, seq int) (id string, body []byte) {
	id = fmt.Sprintf("evt-%s-%d", stream, seq)
	body = fmt.Appendf(nil, `{"event_id":%q,"type":"order.paid","schema_version":1,"occurred_at":"2025-06-01T12:00:00.123456Z","stream":%q,"data":{"order_id":7,"sequence":%d}}`,
		id, stream, seq)
	return id, body
}

// deliver POSTs body as the service does, signed with key at ts, by
// client.
func deliver(ctx context.Context, client *http.Client, url, key, id string, ts time.Time, body []byte) (*http.Response, error) {
	req, err := eventsink.SignedRequest(ctx, url, key, id, ts, body)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// status delivers the event stream/seq now and returns the status.
func status(t *testing.T, s *eventsink.Sink, stream string, seq int) int {
	t.Helper()
	id, body := event(stream, seq)
	resp, err := deliver(t.Context(), http.DefaultClient, s.URL(), secret, id, time.Now(), body)
	if err != nil {
		t.Fatalf("deliver %s: %v", id, err)
	}
	return resp.StatusCode
}

// control POSTs a control route and wants 204.
func control(t *testing.T, s *eventsink.Sink, route string) {
	t.Helper()
	resp, err := http.Post(s.ControlURL()+route, "", nil)
	if err != nil {
		t.Fatalf("control %s: %v", route, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("control %s: %d", route, resp.StatusCode)
	}
}

func statuses(rec []eventsink.Delivery) []int {
	out := make([]int, len(rec))
	for i, d := range rec {
		out[i] = d.Status
	}
	return out
}

func TestRecordsADelivery(t *testing.T) {
	s, file := start(t)
	before := time.Now()
	if got := status(t, s, "order:7", 1); got != http.StatusOK {
		t.Fatalf("status %d", got)
	}
	rec := s.Record()
	if len(rec) != 1 {
		t.Fatalf("record %+v", rec)
	}
	d := rec[0]
	if d.WebhookID != "evt-order:7-1" || d.Type != "order.paid" || d.Stream != "order:7" || d.Sequence != 1 ||
		d.SchemaVersion != 1 || d.Status != 200 || d.Fault != "" {
		t.Errorf("delivery %+v", d)
	}
	if want := time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC); !d.OccurredAt.Equal(want) {
		t.Errorf("occurred_at %s, want %s", d.OccurredAt, want)
	}
	if d.WebhookTimestamp < before.Unix() || d.WebhookTimestamp > time.Now().Unix() {
		t.Errorf("webhook_timestamp %d", d.WebhookTimestamp)
	}
	if d.Arrived.Before(before.Truncate(time.Microsecond)) || d.Answered.Before(d.Arrived) {
		t.Errorf("arrived %s answered %s, test began %s", d.Arrived, d.Answered, before)
	}
	if string(d.Data) != `{"order_id":7,"sequence":1}` {
		t.Errorf("data %s", d.Data)
	}

	// The file holds the same, and so does the control route.
	fromFile, err := eventsink.ReadRecordFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromFile, rec) {
		t.Errorf("file %+v\nmemory %+v", fromFile, rec)
	}
	resp, err := http.Get(s.ControlURL() + "record")
	if err != nil {
		t.Fatal(err)
	}
	fromControl, err := eventsink.ReadRecord(resp.Body)
	resp.Body.Close()
	if err != nil || !reflect.DeepEqual(fromControl, rec) {
		t.Errorf("control record %+v (%v)", fromControl, err)
	}
	resp, err = http.Get(s.ControlURL() + "summary")
	if err != nil {
		t.Fatal(err)
	}
	var sum eventsink.Summary
	err = json.NewDecoder(resp.Body).Decode(&sum)
	resp.Body.Close()
	if err != nil || sum.Acknowledged != 1 || sum.Deliveries != 1 || !sum.OK {
		t.Errorf("control summary %+v (%v)", sum, err)
	}
}

func TestRefusesWhatDoesNotVerify(t *testing.T) {
	s, file := start(t)
	id, body := event("order:7", 1)
	cases := []struct {
		name   string
		key    string
		ts     time.Time
		body   []byte
		status int
	}{
		{"another secret", otherSecret, time.Now(), body, 401},
		{"signed six minutes ago", secret, time.Now().Add(-6 * time.Minute), body, 401},
		{"signed six minutes ahead", secret, time.Now().Add(6 * time.Minute), body, 401},
		{"not JSON", secret, time.Now(), []byte(`{"event_id":`), 400},
		{"event_id is not the webhook-id", secret, time.Now(), bytes.Replace(body, []byte(`"evt-`), []byte(`"other-`), 1), 400},
		{"no sequence", secret, time.Now(), bytes.Replace(body, []byte(`,"sequence":1`), nil, 1), 400},
		{"sequence 0", secret, time.Now(), bytes.Replace(body, []byte(`"sequence":1`), []byte(`"sequence":0`), 1), 400},
	}
	for _, c := range cases {
		resp, err := deliver(t.Context(), http.DefaultClient, s.URL(), c.key, id, c.ts, c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d", c.name, resp.StatusCode, c.status)
		}
	}
	rec := s.Record()
	if len(rec) != len(cases) {
		t.Fatalf("record %+v", rec)
	}
	for i, d := range rec {
		if d.Status != cases[i].status || d.Type != "" || d.Stream != "" || d.Data != nil || d.Error == "" {
			t.Errorf("%s: recorded %+v", cases[i].name, d)
		}
	}
	// Nothing of a body that failed the signature reaches the file.
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("order_id")) {
		t.Errorf("the file holds a body:\n%s", raw)
	}
	if sum := s.Summary(); sum.Rejected != len(cases) || sum.Deliveries != 0 {
		t.Errorf("summary %+v", sum)
	}
}

func TestFailFirst(t *testing.T) {
	s, _ := start(t)
	control(t, s, "fail?n=2")
	var got []int
	for range 3 {
		got = append(got, status(t, s, "order:7", 1))
	}
	if want := []int{500, 500, 200}; !reflect.DeepEqual(got, want) || !reflect.DeepEqual(statuses(s.Record()), want) {
		t.Fatalf("answered %v, recorded %v, want %v", got, statuses(s.Record()), want)
	}
	if f := s.Record()[0].Fault; f != eventsink.FaultFail {
		t.Errorf("fault %q", f)
	}
	if sum := s.Summary(); sum.Failed != 2 || sum.Acknowledged != 1 || sum.Concurrent != 0 {
		t.Errorf("summary %+v", sum)
	}
}

func TestDownRefusesThenComesBack(t *testing.T) {
	s, _ := start(t)
	// A kept-alive connection from before must not carry deliveries
	// through the outage either.
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	id, body := event("order:7", 1)
	if resp, err := deliver(t.Context(), client, s.URL(), secret, id, time.Now(), body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("before: %v", err)
	}

	const outage = 300 * time.Millisecond
	downAt := time.Now()
	control(t, s, "down?for="+outage.String())
	if _, err := net.Dial("tcp", s.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while down: %v, want connection refused", err)
	}
	// The first attempt may find the pooled connection closed and redial:
	// either way it must fail.
	if _, err := deliver(t.Context(), client, s.URL(), secret, id, time.Now(), body); err == nil {
		t.Fatal("a delivery went through while down")
	}
	// The control listener answers meanwhile.
	resp, err := http.Get(s.ControlURL() + "summary")
	if err != nil {
		t.Fatalf("control while down: %v", err)
	}
	resp.Body.Close()

	// It comes back by itself on the same address.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := deliver(t.Context(), client, s.URL(), secret, id, time.Now(), body)
		if err == nil {
			if resp.StatusCode != 200 {
				t.Fatalf("after: status %d", resp.StatusCode)
			}
			break
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("while down: %v, want connection refused", err)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("never came back")
		}
	}
	if up := time.Since(downAt); up < outage {
		t.Errorf("back after %s, down for %s", up, outage)
	}

	// Down for long, then Up brings it back at once.
	control(t, s, "down?for=1h")
	if s.IsUp() {
		t.Fatal("up after down")
	}
	control(t, s, "up")
	if got := status(t, s, "order:7", 2); got != 200 {
		t.Fatalf("after up: %d", got)
	}
	if want := []int{200, 200, 200}; !reflect.DeepEqual(statuses(s.Record()), want) {
		t.Errorf("recorded %v, want %v: nothing is recorded while down", statuses(s.Record()), want)
	}
}

func TestHang(t *testing.T) {
	s, _ := start(t)
	id, body := event("order:7", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	// A sender that gives up (as its timeout would) while held: not
	// answered, and timed by when it left, so that its retry is not taken
	// for a concurrent delivery.
	control(t, s, "hang?for=1m")
	leave, leaveNow := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := deliver(leave, http.DefaultClient, s.URL(), secret, id, time.Now(), body)
		gone <- err
	}()
	if err := s.WaitHeld(ctx, 1); err != nil {
		t.Fatal(err)
	}
	leaveNow()
	if err := <-gone; err == nil {
		t.Fatal("a held delivery was answered")
	}
	if err := s.WaitFor(ctx, func(r []eventsink.Delivery) bool { return len(r) == 1 }); err != nil {
		t.Fatal(err)
	}
	s.Hang(0)
	if resp, err := deliver(ctx, http.DefaultClient, s.URL(), secret, id, time.Now(), body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the retry: %v", err)
	}
	rec := s.Record()
	if rec[0].Status != 0 || rec[0].Fault != eventsink.FaultHang || rec[0].Answered.Before(rec[0].Arrived) {
		t.Errorf("the held delivery: %+v", rec[0])
	}
	if sum := s.Summary(); sum.Concurrent != 0 || sum.Acknowledged != 1 || sum.Failed != 1 {
		t.Errorf("summary %+v", sum)
	}

	// Two senders of one event held at once are answered when the hang is
	// lifted, and are what Summarize calls concurrent.
	control(t, s, "hang?for=1m")
	id2, body2 := event("order:7", 2)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Go(func() {
			resp, err := deliver(ctx, http.DefaultClient, s.URL(), secret, id2, time.Now(), body2)
			if err != nil {
				t.Errorf("patient sender: %v", err)
				return
			}
			codes[i] = resp.StatusCode
		})
	}
	if err := s.WaitHeld(ctx, 2); err != nil {
		t.Fatal(err)
	}
	control(t, s, "hang?for=0s")
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Errorf("patient senders: %v", codes)
	}
	if sum := s.Summary(); sum.Concurrent != 1 || sum.Duplicates != 1 || sum.Acknowledged != 2 {
		t.Errorf("summary %+v", sum)
	}

	// A hang ends by itself after its time.
	const hang = 100 * time.Millisecond
	hungAt := time.Now()
	s.Hang(hang)
	if got := status(t, s, "order:7", 3); got != 200 {
		t.Errorf("after the hang: %d", got)
	}
	if waited := time.Since(hungAt); waited < hang {
		t.Errorf("answered after %s, the hang was %s", waited, hang)
	}
}

func TestCloseNext(t *testing.T) {
	s, _ := start(t)
	control(t, s, "close?n=1")
	id, body := event("order:7", 1)
	if _, err := deliver(t.Context(), http.DefaultClient, s.URL(), secret, id, time.Now(), body); err == nil {
		t.Fatal("a delivery whose connection was closed was answered")
	}
	if got := status(t, s, "order:7", 1); got != 200 {
		t.Fatalf("the next: %d", got)
	}
	rec := s.Record()
	if len(rec) != 2 || rec[0].Status != 0 || rec[0].Fault != eventsink.FaultClose || rec[1].Status != 200 {
		t.Errorf("record %+v", rec)
	}
}

func TestControlRefusesBadArguments(t *testing.T) {
	s, _ := start(t)
	for _, route := range []string{"fail?n=-1", "fail", "close?n=x", "hang?for=10", "down?for=-1s"} {
		resp, err := http.Post(s.ControlURL()+route, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", route, resp.StatusCode)
		}
	}
	if !s.IsUp() {
		t.Error("a refused down took the sink down")
	}
}

func TestStartRefusesABadSecret(t *testing.T) {
	for _, bad := range []string{"", "whsec_c2hvcnQ=", secret + ",nope"} {
		if s, err := eventsink.Start(t.Context(), eventsink.Options{Secret: bad}); err == nil {
			s.Close()
			t.Errorf("Start accepted %q", bad)
		}
	}
	// A rotation's list verifies with either.
	s, err := eventsink.Start(t.Context(), eventsink.Options{Secret: otherSecret + "," + secret})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := status(t, s, "order:7", 1); got != 200 {
		t.Errorf("signed with the second secret: %d", got)
	}
}
