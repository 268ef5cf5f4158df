package stripepay_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"shop/internal/stripepay"
	"shop/internal/striperec"
)

// onlyCall returns the one call the recorder logged.
func onlyCall(t *testing.T, calls []striperec.Call) striperec.Call {
	t.Helper()
	if len(calls) != 1 {
		t.Fatalf("%d calls logged, want 1: %+v", len(calls), calls)
	}
	return calls[0]
}

// A PaymentIntent is created for the order's amount, in its currency lower
// cased, with metadata.order_id and the key it is given.
func TestCreateIntent(t *testing.T) {
	rec := recorder(t)
	c := client(t, rec.URL)
	in, err := c.CreateIntent(context.Background(), 42, 1299, "EUR", "01JCHECKOUTKEY0000000000042")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(in.ID, "pi_") || in.ClientSecret == "" {
		t.Errorf("intent %+v", in)
	}
	call := onlyCall(t, rec.Calls(t))
	if call.Method != "POST" || call.Path != "/v1/payment_intents" || call.Status != http.StatusOK {
		t.Errorf("call %s %s answered %d", call.Method, call.Path, call.Status)
	}
	if call.IdempotencyKey != "01JCHECKOUTKEY0000000000042" {
		t.Errorf("Idempotency-Key %q", call.IdempotencyKey)
	}
	for field, want := range map[string]string{"amount": "1299", "currency": "eur", "metadata[order_id]": "42"} {
		if got := call.Form[field]; got != want {
			t.Errorf("%s = %q, want %q", field, got, want)
		}
	}

	// Arguments that Stripe would refuse are refused before any call.
	for _, bad := range []struct {
		order, amount int64
		currency, key string
	}{{0, 1299, "EUR", "k"}, {42, 0, "EUR", "k"}, {42, 1299, "EURO", "k"}, {42, 1299, "E1R", "k"}, {42, 1299, "EUR", ""}} {
		_, err := c.CreateIntent(context.Background(), bad.order, bad.amount, bad.currency, bad.key)
		if err == nil || stripepay.Retryable(err) || stripepay.KindOf(err) != stripepay.KindInvalid {
			t.Errorf("CreateIntent%+v: %v, want a permanent invalid error", bad, err)
		}
	}
	if n := len(rec.Calls(t)); n != 1 {
		t.Errorf("%d calls logged after refused arguments, want still 1", n)
	}
}

// A refund is asked for with its own id as the Idempotency-Key and as
// metadata.refund_id, for the payment's amount on its PaymentIntent.
func TestRefundSendsItsID(t *testing.T) {
	rec := recorder(t)
	c := client(t, rec.URL)
	s, err := c.Refund(context.Background(), stripepay.RefundRequest{RefundID: "01JREFUND000000000000000001", PaymentIntent: "pi_paid", AmountCents: 1299})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.ProviderRefundID, "re_") || s.Status != "succeeded" || s.Listed {
		t.Errorf("settled %+v", s)
	}
	call := onlyCall(t, rec.Calls(t))
	if call.Method != "POST" || call.Path != "/v1/refunds" || call.Status != http.StatusOK {
		t.Errorf("call %s %s answered %d", call.Method, call.Path, call.Status)
	}
	if call.IdempotencyKey != "01JREFUND000000000000000001" || call.RefundID != "01JREFUND000000000000000001" {
		t.Errorf("Idempotency-Key %q, metadata[refund_id] %q", call.IdempotencyKey, call.RefundID)
	}
	if call.Form["payment_intent"] != "pi_paid" || call.Form["amount"] != "1299" {
		t.Errorf("form %v", call.Form)
	}
}

// A PaymentIntent is cancelled; one that can no longer be is
// ErrIntentFinal, with its status, and not worth a retry.
func TestCancelIntent(t *testing.T) {
	rec := recorder(t)
	c := client(t, rec.URL)
	if err := c.CancelIntent(context.Background(), "pi_lapsed"); err != nil {
		t.Fatal(err)
	}
	rec.Inject("POST", "/v1/payment_intents/pi_paid/cancel", http.StatusBadRequest,
		`{"error":{"code":"payment_intent_unexpected_state","type":"invalid_request_error",
		"message":"You cannot cancel this PaymentIntent because it has a status of succeeded.",
		"payment_intent":{"id":"pi_paid","object":"payment_intent","status":"succeeded"}}}`)
	err := c.CancelIntent(context.Background(), "pi_paid")
	var final *stripepay.IntentFinalError
	if !errors.Is(err, stripepay.ErrIntentFinal) || !errors.As(err, &final) || final.Status != "succeeded" || final.ID != "pi_paid" {
		t.Fatalf("cancel of a paid intent: %v, want ErrIntentFinal with status succeeded", err)
	}
	if stripepay.Retryable(err) {
		t.Error("ErrIntentFinal is retryable")
	}
	calls := rec.Calls(t)
	if len(calls) != 2 || calls[0].Path != "/v1/payment_intents/pi_lapsed/cancel" || calls[0].Status != http.StatusOK {
		t.Errorf("calls %+v", calls)
	}
}

// Stripe's answers are told apart as the refunder needs: what may succeed
// later, and what never will.
func TestErrorKinds(t *testing.T) {
	rec := recorder(t)
	c := client(t, rec.URL)
	for _, tc := range []struct {
		status    int
		body      string
		kind      stripepay.Kind
		retryable bool
	}{
		{429, `{"error":{"code":"lock_timeout","type":"invalid_request_error","message":"busy"}}`, stripepay.KindLockTimeout, true},
		{429, `{"error":{"code":"rate_limit","type":"invalid_request_error","message":"slow down"}}`, stripepay.KindRateLimited, true},
		{409, `{"error":{"type":"idempotency_error","message":"another request with this key is in progress"}}`, stripepay.KindConflict, true},
		{500, `{"error":{"type":"api_error","message":"oops"}}`, stripepay.KindServer, true},
		{502, `<html>bad gateway</html>`, stripepay.KindServer, true},
		{401, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`, stripepay.KindAuth, true},
		{400, `{"error":{"code":"resource_missing","type":"invalid_request_error","message":"No such payment_intent"}}`, stripepay.KindInvalid, false},
		{400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`, stripepay.KindInvalid, false},
	} {
		rec.Inject("POST", "/v1/refunds", tc.status, tc.body)
		_, err := c.Refund(context.Background(), stripepay.RefundRequest{RefundID: "01JKINDS", PaymentIntent: "pi_1", AmountCents: 100})
		if err == nil || stripepay.KindOf(err) != tc.kind || stripepay.Retryable(err) != tc.retryable {
			t.Errorf("answer %d %s: %v (kind %s, retryable %t), want kind %s, retryable %t",
				tc.status, tc.body, err, stripepay.KindOf(err), stripepay.Retryable(err), tc.kind, tc.retryable)
		}
	}
}

// No answer — nothing listening, or an answer that does not come within
// the timeout — is a retryable network error, and the timeout bounds the
// call.
func TestNoAnswer(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	// stall answers nothing until the test ends.
	end := make(chan struct{})
	stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-end }))
	t.Cleanup(stall.Close)
	t.Cleanup(func() { close(end) })
	for _, base := range []string{closed.URL, stall.URL} {
		c, err := stripepay.New(stripepay.Config{SecretKey: "sk_test_shop", APIBase: base, Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = c.Refund(context.Background(), stripepay.RefundRequest{RefundID: "01JNOANSWER", PaymentIntent: "pi_1", AmountCents: 100})
		if stripepay.KindOf(err) != stripepay.KindNetwork || !stripepay.Retryable(err) {
			t.Errorf("%s: %v, want a retryable network error", base, err)
		}
		// Far above 200 ms, for a loaded machine; stripe-go's own retries
		// (off) would each take as long again, with sleeps between.
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("%s: the call took %s, with a 200ms timeout", base, took)
		}
	}
}

// refundList is a page of GET /v1/refunds.
func refundList(refunds ...string) string {
	return `{"object":"list","url":"/v1/refunds","has_more":false,"data":[` + strings.Join(refunds, ",") + `]}`
}

func refundObject(id, status, refundID string) string {
	return `{"id":"` + id + `","object":"refund","amount":1299,"currency":"usd","payment_intent":"pi_paid","status":"` + status +
		`","metadata":{"refund_id":"` + refundID + `"}}`
}

const alreadyRefunded = `{"error":{"code":"charge_already_refunded","type":"invalid_request_error","message":"Charge ch_1 has already been refunded."}}`

// charge_already_refunded (a repeat after Stripe's 24 hours have forgotten
// the key) is answered by listing the PaymentIntent's refunds: the one
// named by our refund id if there is one, else one that succeeded.
func TestChargeAlreadyRefunded(t *testing.T) {
	req := stripepay.RefundRequest{RefundID: "01JOURS", PaymentIntent: "pi_paid", AmountCents: 1299}

	t.Run("stripe-mock's list", func(t *testing.T) {
		rec := recorder(t)
		c := client(t, rec.URL)
		rec.Inject("POST", "/v1/refunds", http.StatusBadRequest, alreadyRefunded)
		s, err := c.Refund(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		// stripe-mock drops metadata: its list's refund, which succeeded,
		// is the one found.
		if want := listedByMock(t, rec.URL); s != (stripepay.Settled{ProviderRefundID: want, Status: "succeeded", Listed: true}) {
			t.Errorf("settled %+v, want %s from the list", s, want)
		}
		calls := rec.Calls(t)[:2]
		if c := calls[0]; c.Path != "/v1/refunds" || c.Method != "POST" || c.Status != http.StatusBadRequest || c.IdempotencyKey != "01JOURS" {
			t.Errorf("first call %+v", c)
		}
		if c := calls[1]; c.Path != "/v1/refunds" || c.Method != "GET" || !strings.Contains(c.Query, "payment_intent=pi_paid") || c.Status != http.StatusOK {
			t.Errorf("second call %+v", c)
		}
	})

	for _, tc := range []struct {
		name      string
		list      string
		want      stripepay.Settled
		kind      stripepay.Kind
		retryable bool
	}{
		{"ours before another's", refundList(refundObject("re_other", "succeeded", ""), refundObject("re_failed", "failed", "01JOURS"), refundObject("re_ours", "pending", "01JOURS")),
			stripepay.Settled{ProviderRefundID: "re_ours", Status: "pending", Listed: true}, "", false},
		{"another's that succeeded", refundList(refundObject("re_pending", "pending", ""), refundObject("re_other", "succeeded", "")),
			stripepay.Settled{ProviderRefundID: "re_other", Status: "succeeded", Listed: true}, "", false},
		{"only pending ones", refundList(refundObject("re_pending", "pending", "")), stripepay.Settled{}, stripepay.KindPending, true},
		{"none that counts", refundList(refundObject("re_failed", "failed", "01JOURS")), stripepay.Settled{}, stripepay.KindInvalid, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := recorder(t)
			c := client(t, rec.URL)
			rec.Inject("POST", "/v1/refunds", http.StatusBadRequest, alreadyRefunded)
			rec.Inject("GET", "/v1/refunds", http.StatusOK, tc.list)
			s, err := c.Refund(context.Background(), req)
			if s != tc.want {
				t.Errorf("settled %+v, want %+v", s, tc.want)
			}
			if tc.kind == "" && err != nil {
				t.Errorf("error %v", err)
			}
			if tc.kind != "" && (stripepay.KindOf(err) != tc.kind || stripepay.Retryable(err) != tc.retryable) {
				t.Errorf("error %v, want kind %s, retryable %t", err, tc.kind, tc.retryable)
			}
		})
	}
}

// listedByMock returns the id of the first refund stripe-mock lists.
func listedByMock(t *testing.T, base string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/v1/refunds?payment_intent=pi_paid", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk_test_shop")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		t.Fatalf("stripe-mock's list of refunds: %v, %d refunds", err, len(list.Data))
	}
	return list.Data[0].ID
}
