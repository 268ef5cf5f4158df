package stripepay_test

import (
	"os"
	"testing"
	"time"

	"shop/internal/stripepay"
	"shop/internal/testenv"
)

// The tests share one stripe-mock, which takes a second or two to start.
// It is stateless, so they cannot see each other's calls there; each logs
// its calls through a recording proxy of its own.
var sharedMock testenv.Shared[string]

func TestMain(m *testing.M) {
	code := m.Run()
	sharedMock.Close()
	os.Exit(code)
}

// recorder returns a recording proxy in front of the shared stripe-mock.
func recorder(t *testing.T) *testenv.StripeRec {
	t.Helper()
	return testenv.StartStripeRecorder(t, sharedMock.Get(t, testenv.StripeMock))
}

// callTimeout is the tests' clients' Timeout: far longer than a call to a
// stripe-mock on loopback takes, even on a loaded machine.
const callTimeout = 5 * time.Second

// client returns a client of base.
func client(t *testing.T, base string) *stripepay.Client {
	t.Helper()
	c, err := stripepay.New(stripepay.Config{SecretKey: "sk_test_shop", APIBase: base, Timeout: callTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
