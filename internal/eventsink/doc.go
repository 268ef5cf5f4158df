// Package eventsink is a receiver of the service's outbox events, to test
// the relay against and to measure it in the demo. It is what a system
// downstream would run, reduced to what the tests need to see: it checks
// each delivery, answers it, and records it.
//
// # Deliveries
//
// Start listens on two addresses: the events listener, whose URL is what
// SHOP_EVENTS_URL names (any path is accepted), and a control listener.
// A delivery is a POST signed by Standard Webhooks with the secret the sink
// was given (whsec_ + base64, a comma list while a secret is rotated, as
// SHOP_EVENTS_SECRET holds it). The sink answers:
//
//   - 401 when the signature does not verify, or the webhook-timestamp is
//     more than the library's 5 minutes from the sink's clock;
//   - 400 when the body is not the envelope (JSON with event_id equal to
//     the webhook-id, a type, a stream, occurred_at in RFC 3339, and data
//     with an integer sequence of at least 1);
//   - 200 otherwise, unless a fault below is armed.
//
// Every request that reaches the handler is recorded as a Delivery: its
// headers, the envelope's type, stream, sequence and occurred_at, the sink's
// times of arrival and answer, the status, and the raw data. A request that
// fails the signature is recorded without anything from its body. The record
// is kept in memory (Record, WaitFor) and, with Options.RecordFile, appended
// to a file as JSON lines, one Delivery each, so that another process can
// read it (ReadRecord, ReadRecordFile, or `eventsink -summary FILE`). A file
// that exists is appended to, not emptied: a run that wants its own record
// removes it first.
//
// # Faults
//
// The faults are armed from Go or over HTTP on the control listener, which
// stays up while the events listener is down:
//
//	POST /control/fail?n=3       FailFirst(3): answer 500 to the next 3 deliveries
//	POST /control/down?for=10s   Down(10s): refuse connections for 10 s
//	POST /control/up             Up(): listen again now
//	POST /control/hang?for=6s    Hang(6s): hold deliveries arriving in the next 6 s until then
//	POST /control/close?n=2      CloseNext(2): close the next 2 connections without an answer
//	GET  /control/record         the record, as JSON lines
//	GET  /control/summary        Summarize of the record, as JSON
//
// Faults apply to deliveries that verified and parsed, in the order close,
// hang, fail (a delivery held by Hang may then be failed), and are recorded
// with the fault's name: "fail" (status 500), "close" (status 0: no answer
// was written) and "hang". A held delivery whose sender gives up (its timeout
// closes the connection) is recorded with status 0 and answered at the time
// the sink saw the connection close; one whose sender is still there when
// the hang ends is answered as any other. WaitHeld lets a test act once its
// sender's delivery is being held, rather than after a sleep.
//
// # Analysis
//
// Summarize reads a record and counts what the delivery promise is about:
// distinct events acknowledged, deliveries of one event acknowledged more
// than once (allowed), deliveries that went back on a stream (out of
// order), events acknowledged while their stream's previous sequence never
// was (gaps), deliveries of one event that overlapped in time (concurrent),
// and the lag from occurred_at to the first acknowledgement. Out of order,
// gaps and concurrent must be 0; the command exits 1 when they are not.
package eventsink
