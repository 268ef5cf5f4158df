package eventsink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The faults a Delivery may be recorded with.
const (
	FaultFail  = "fail"
	FaultClose = "close"
	FaultHang  = "hang"
)

// Delivery is one request the events listener handled: one line of the
// record file.
type Delivery struct {
	// WebhookID and WebhookTimestamp are the request's headers (the
	// timestamp in Unix seconds, 0 when it is not a number). On a
	// delivery that failed the signature they are what was sent, unchecked.
	WebhookID        string `json:"webhook_id"`
	WebhookTimestamp int64  `json:"webhook_timestamp"`
	// Type, Stream, Sequence, OccurredAt, SchemaVersion and Data are the
	// envelope's, empty on a delivery answered 400 or 401.
	Type          string          `json:"type,omitempty"`
	Stream        string          `json:"stream,omitempty"`
	Sequence      int64           `json:"sequence,omitempty"`
	OccurredAt    time.Time       `json:"occurred_at,omitzero"`
	SchemaVersion int             `json:"schema_version,omitempty"`
	Data          json.RawMessage `json:"data,omitempty"`
	// Arrived is when the handler began, Answered when it wrote its
	// answer (taken before the write, so that nothing the sender does
	// after the answer can precede it), or when a sender that was not
	// answered was seen to close its connection. Both are the sink's clock.
	Arrived  time.Time `json:"arrived"`
	Answered time.Time `json:"answered"`
	// Status is the HTTP status answered; 0 when none was written (the
	// connection was closed, by a fault or by the sender).
	Status int `json:"status"`
	// Fault names the fault applied, if any (FaultFail, FaultClose,
	// FaultHang); Error says why a delivery was refused or not answered.
	Fault string `json:"fault,omitempty"`
	Error string `json:"error,omitempty"`
}

// Acknowledged says whether the delivery was answered 2xx.
func (d Delivery) Acknowledged() bool { return d.Status >= 200 && d.Status < 300 }

// Verified says whether the delivery carried a valid, signed envelope:
// only those take part in the analysis of streams.
func (d Delivery) Verified() bool { return d.Stream != "" }

// ReadRecord reads a record written as JSON lines. A last line without its
// newline is ignored, since the sink may be writing it while another
// process reads.
func ReadRecord(r io.Reader) ([]Delivery, error) {
	br := bufio.NewReader(r)
	var out []Delivery
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read record: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var d Delivery
		if err := json.Unmarshal(line, &d); err != nil {
			return nil, fmt.Errorf("record line %d: %w", n, err)
		}
		out = append(out, d)
	}
}

// ReadRecordFile reads the record file at path.
func ReadRecordFile(path string) ([]Delivery, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open record: %w", err)
	}
	defer f.Close()
	return ReadRecord(f)
}

// WriteRecord writes deliveries as JSON lines, the format of the file.
func WriteRecord(w io.Writer, record []Delivery) error {
	bw := bufio.NewWriter(w)
	for _, d := range record {
		line, err := marshalLine(d)
		if err != nil {
			return err
		}
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("write record: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write record: %w", err)
	}
	return nil
}

// marshalLine is one delivery as a line of the record.
func marshalLine(d Delivery) ([]byte, error) {
	line, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode delivery %s: %w", d.WebhookID, err)
	}
	return append(line, '\n'), nil
}

// SignedRequest is a delivery as the service makes it: body POSTed to url,
// signed by Standard Webhooks with secret (whsec_ + base64) for the message
// id at ts. The sink's tests send it, and a test of a sender can compare.
func SignedRequest(ctx context.Context, url, secret, id string, ts time.Time, body []byte) (*http.Request, error) {
	hook, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	sig, err := hook.Sign(id, ts, body)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	req.Header.Set(standardwebhooks.HeaderWebhookID, id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}
