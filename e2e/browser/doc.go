// Package browser tests the status page in headless Chromium and the dashboard's queries on a real Prometheus, against real fleets.
package browser
