package kubebackend

import (
	"context"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestJobRecordLosesToANewTerm ends the holder's term and starts the next one between the
// read that finds the holder's token and the write of its job's record: the write, made at
// the resourceVersion read, must fail, read again and report false, leaving the new term's
// object as it was.
func TestJobRecordLosesToANewTerm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const election = "jobs"
	a, next := admin(t, srv), admin(t, srv)
	la, _, err := a.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	won, err := a.Campaign(ctx, election, []byte("a"), la)
	if err != nil || won.Holder == nil || won.Holder.Lease != la {
		t.Fatalf("Campaign = %+v, %v", won.Holder, err)
	}
	var successor int64
	leases, err := a.client()
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.leases = &beforeUpdate{LeaseInterface: leases, run: func() {
		// An operator's delete of the key and the next campaign, both after a's read.
		seen, err := next.Observe(ctx, election)
		if err != nil {
			t.Error(err)
			return
		}
		if ok, err := next.Expire(ctx, election, won.Holder.Token, seen.Revision); err != nil || !ok {
			t.Errorf("Expire = %v, %v", ok, err)
			return
		}
		lb, _, err := next.Grant(ctx, time.Minute)
		if err != nil {
			t.Error(err)
			return
		}
		o, err := next.Campaign(ctx, election, []byte("next"), lb)
		if err != nil || o.Holder == nil || o.Holder.Lease != lb {
			t.Errorf("the next term's Campaign = %+v, %v", o.Holder, err)
			return
		}
		successor = o.Holder.Token
	}}
	a.mu.Unlock()

	if ok, err := a.PutJobRecord(ctx, election, "backup", won.Holder.Token, []byte("late")); err != nil || ok {
		t.Fatalf("PutJobRecord by the ended term = %v, %v; want false", ok, err)
	}
	o, err := next.Observe(ctx, election)
	if err != nil || o.Holder == nil || o.Holder.Token != successor || string(o.Holder.Value) != "next" {
		t.Fatalf("after the ended term's put the key is %+v, %v; want the next term's (token %d)", o.Holder, err, successor)
	}
	if got, err := next.JobRecord(ctx, election, "backup"); err != nil || got != nil {
		t.Fatalf("JobRecord = %q, %v; want none", got, err)
	}
}

// beforeUpdate runs run once, before the first update it passes on.
type beforeUpdate struct {
	coordclient.LeaseInterface
	run func()
}

func (l *beforeUpdate) Update(ctx context.Context, obj *coordv1.Lease, opts metav1.UpdateOptions) (*coordv1.Lease, error) {
	if run := l.run; run != nil {
		l.run = nil
		run()
	}
	return l.LeaseInterface.Update(ctx, obj, opts)
}
