package payments_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"shop/internal/payments"
)

// now is the clock of every test: a fixed instant, so that the tolerance's
// edges are exact whatever the machine's load.
var now = time.Unix(1_700_000_000, 0)

// Valid values of each field, and Stripe's secrets, reused by the tests.
const (
	refundID          = "01JABCDEFGHJKMNPQRSTVWXYZ0"
	paymentID         = "pi_3MtwBwLkdIwHu7ix28a3tqPa"
	eventID           = "evt_1NG8Du2eZvKYlo2CUI79vXWy"
	stripeRefundID    = "re_3MtwBwLkdIwHu7ix0LXT3Fa1"
	stripeSecret      = "whsec_test_0123456789abcdefghijklmnopqrstuv"
	stripeOtherSecret = "whsec_test_vutsrqponmlkjihgfedcba9876543210"
)

// wantEvent fails unless err is nil and e is want. Its type must be one of
// the fixed list, and exactly one of Payment, Refund and Ignored set.
func wantEvent(t *testing.T, e payments.Event, err error, want payments.Event) {
	t.Helper()
	if err != nil {
		t.Fatalf("Verify: %v, want %+v", err, want)
	}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("Verify = %s, want %s", show(e), show(want))
	}
	if !slices.Contains(payments.Types(), e.Type) {
		t.Errorf("Type %q is not in Types()", e.Type)
	}
	set := 0
	for _, isSet := range []bool{e.Payment != nil, e.Refund != nil, e.Ignored != ""} {
		if isSet {
			set++
		}
	}
	if set != 1 {
		t.Errorf("%s: %d of Payment, Refund, Ignored set, want 1", show(e), set)
	}
}

// wantErr fails unless err is target and not the other of ErrSignature and
// ErrMalformed, and names none of secrets.
func wantErr(t *testing.T, e payments.Event, err, target error, secrets ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("Verify = %s, %v; want %v", show(e), err, target)
	}
	other := payments.ErrMalformed
	if target == payments.ErrMalformed {
		other = payments.ErrSignature
	}
	if errors.Is(err, other) {
		t.Errorf("Verify: %v is both %v and %v", err, target, other)
	}
	if !reflect.DeepEqual(e, payments.Event{}) {
		t.Errorf("Verify returned %s with its error, want the zero Event", show(e))
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("Verify: %q shows a secret", err)
		}
	}
}

// show prints an event with what its pointers point to.
func show(e payments.Event) string {
	s := fmt.Sprintf("{ID:%q Type:%q Ignored:%q", e.ID, e.Type, e.Ignored)
	if e.Payment != nil {
		s += fmt.Sprintf(" Payment:%+v", *e.Payment)
	}
	if e.Refund != nil {
		s += fmt.Sprintf(" Refund:%+v", *e.Refund)
	}
	return s + "}"
}

func TestCheckCurrency(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"USD", "USD"}, {"usd", "USD"}, {"eUr", "EUR"}, {"JPY", "JPY"},
	} {
		got, err := payments.CheckCurrency(c.in)
		if err != nil || got != c.want {
			t.Errorf("CheckCurrency(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "US", "USDD", "U$D", "US1", " US", "ÜSD", "US\x00"} {
		if got, err := payments.CheckCurrency(bad); !errors.Is(err, payments.ErrMalformed) {
			t.Errorf("CheckCurrency(%q) = %q, %v; want ErrMalformed", bad, got, err)
		}
	}
}

func TestCheckPaymentID(t *testing.T) {
	for _, ok := range []string{"a", "pay_1", "A-Z_a-z_0-9", paymentID, strings.Repeat("x", 64)} {
		if err := payments.CheckPaymentID(ok); err != nil {
			t.Errorf("CheckPaymentID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 65), "a b", "a/b", "a.b", "é", "a\n"} {
		if err := payments.CheckPaymentID(bad); !errors.Is(err, payments.ErrMalformed) {
			t.Errorf("CheckPaymentID(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestCheckRefundID(t *testing.T) {
	for _, ok := range []string{refundID, "00000000000000000000000000", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"} {
		if err := payments.CheckRefundID(ok); err != nil {
			t.Errorf("CheckRefundID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		refundID[:25],                 // too short
		refundID + "0",                // too long
		strings.ToLower(refundID),     // not the canonical form
		"8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  // above 128 bits
		"01JABCDEFGHJKMNPQRSTVWXYZI",  // I, L, O and U are not Crockford digits
		"01JABCDEFGHJKMNPQRSTVWXYZL",  //
		"01JABCDEFGHJKMNPQRSTVWXYZO",  //
		"01JABCDEFGHJKMNPQRSTVWXYZU",  //
		"01JABCDEFGHJKMNPQRSTVWXYZ-",  //
		"01JABCDEFGHJKMNPQRSTVWXYZ\n", //
	} {
		if err := payments.CheckRefundID(bad); !errors.Is(err, payments.ErrMalformed) {
			t.Errorf("CheckRefundID(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestCheckProviderRefundID(t *testing.T) {
	for _, ok := range []string{"re_1", "x", " ~ printable !", strings.Repeat("r", 255)} {
		if err := payments.CheckProviderRefundID(ok); err != nil {
			t.Errorf("CheckProviderRefundID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("r", 256), "re\n1", "re\t1", "ré", "re\x7f"} {
		if err := payments.CheckProviderRefundID(bad); !errors.Is(err, payments.ErrMalformed) {
			t.Errorf("CheckProviderRefundID(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

// Types is a fixed list of distinct labels, "other" among them.
func TestTypes(t *testing.T) {
	types := payments.Types()
	if len(types) != 8 || !slices.Contains(types, payments.TypeOther) {
		t.Errorf("Types() = %v", types)
	}
	sorted := slices.Clone(types)
	slices.Sort(sorted)
	if len(slices.Compact(sorted)) != len(types) {
		t.Errorf("Types() = %v repeats a type", types)
	}
}
