package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Refunds the lifecycle rows leave. Every late payment is recorded as a
// refund owed, and `shop seed` refuses while any refund is unsettled, so
// that a reseed never deletes money silently. With SHOP_PAYMENTS=webhook
// only the provider's word settles a refund, so before each seed the demo
// plays the provider: one signed refund.succeeded event per refund MySQL
// has unsettled, sent to a replica, with provider_refund_id
// re_demo_<refund_id>.

// envWebhookSecret names the provider's secret, which the stack gives the
// replicas and the demo alike: the lifecycle rows' payers (bin/loadtest
// -webhook-secret) and the refunds' settlements are signed with it.
const envWebhookSecret = "SHOP_PAYMENT_WEBHOOK_SECRET"

// demoRefundRef is the provider's reference the demo settles refund id
// with.
func demoRefundRef(id string) string { return "re_demo_" + id }

// settleAttempts bounds the deliveries of one settlement: a replica just
// started, or a MariaDB just restarted, answers 503 for a moment.
const settleAttempts = 10

// settleRefunds settles every refund MySQL (db) has unsettled with a
// refund.succeeded event signed with secret (the first, if it is a
// rotation's comma list), sent to the replica at base, and returns how
// many it settled. It checks that none is left unsettled.
func settleRefunds(ctx context.Context, db *sql.DB, secret, base string) (int, error) {
	ids, err := unsettledRefunds(ctx, db)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if secret == "" {
		return 0, fmt.Errorf("%d refunds are unsettled and %s is not set: the demo settles them with signed refund.succeeded events",
			len(ids), envWebhookSecret)
	}
	hook, err := standardwebhooks.NewWebhook(strings.Split(secret, ",")[0])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", envWebhookSecret, err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for i, id := range ids {
		if err := settleRefund(ctx, client, hook, base, id); err != nil {
			return i, err
		}
	}
	left, err := unsettledRefunds(ctx, db)
	if err != nil {
		return len(ids), err
	}
	if len(left) > 0 {
		return len(ids), fmt.Errorf("%d refunds settled, and %d still unsettled (first: %s)", len(ids), len(left), left[0])
	}
	return len(ids), nil
}

// unsettledRefunds returns the ids of the refunds a seed would refuse to
// delete: those not refunded.
func unsettledRefunds(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT refund_id FROM refunds WHERE state <> 'refunded' ORDER BY refund_id")
	if err != nil {
		return nil, fmt.Errorf("unsettled refunds: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := closeRows(rows); err != nil {
		return nil, fmt.Errorf("unsettled refunds: %w", err)
	}
	return ids, nil
}

// settleRefund delivers refund id's refund.succeeded event to base until
// it is answered, within settleAttempts, and checks that the answer says
// it is refunded. Every delivery carries the same message id and body, and
// a signature of its own time.
func settleRefund(ctx context.Context, client *http.Client, hook *standardwebhooks.Webhook, base, id string) error {
	body, err := json.Marshal(map[string]any{"type": "refund.succeeded",
		"data": map[string]string{"refund_id": id, "provider_refund_id": demoRefundRef(id)}})
	if err != nil {
		return err
	}
	var last error
	for attempt := 1; attempt <= settleAttempts; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt-1) * 200 * time.Millisecond):
			}
		}
		status, answer, err := postEvent(ctx, client, hook, base, "msg_settle_"+id, body)
		switch {
		case err != nil:
			last = err
			continue
		case status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
			last = fmt.Errorf("%d %s", status, answer)
			continue
		case status != http.StatusOK:
			return fmt.Errorf("settle refund %s: %d %s", id, status, answer)
		}
		var res struct {
			Result string `json:"result"`
		}
		if json.Unmarshal(answer, &res) != nil || res.Result != "refunded" {
			return fmt.Errorf("settle refund %s: answered %s, want refunded", id, answer)
		}
		return nil
	}
	return fmt.Errorf("settle refund %s: %d attempts: %w", id, settleAttempts, last)
}

// postEvent sends one delivery of a Standard Webhooks message, signed now,
// to base's payment events route, and returns the answer.
func postEvent(ctx context.Context, client *http.Client, hook *standardwebhooks.Webhook, base, msgID string, body []byte) (int, []byte, error) {
	now := time.Now()
	sig, err := hook.Sign(msgID, now, body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/api/v1/payments/events", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(standardwebhooks.HeaderWebhookID, msgID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("the answer to %s: %w", msgID, err)
	}
	return res.StatusCode, answer, nil
}
